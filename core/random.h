// Deterministic random numbers with a fixed, documented algorithm, so the
// same seed gives bitwise the same numbers on every machine and standard
// library (std:: distributions are implementation-defined; these are not).
//
// Generator: xoshiro256** seeded through SplitMix64. Uniform floats take the
// top 24 (float) or 53 (double) bits; normals use Box-Muller on doubles.
// The whole state is four uint64 words, saved in checkpoints.
//
// Not thread-safe; use one Rng per thread.
#ifndef TRAINYARD_CORE_RANDOM_H_
#define TRAINYARD_CORE_RANDOM_H_

#include <array>
#include <cmath>
#include <cstdint>

namespace trainyard {

class Rng {
 public:
  // Different `stream` values give independent sequences for one seed
  // (e.g. one per parameter tensor).
  explicit Rng(uint64_t seed, uint64_t stream = 0) {
    uint64_t x = seed ^ (0x9E3779B97F4A7C15ull * (stream + 1));
    for (auto& s : s_) s = SplitMix64(&x);
  }

  uint64_t NextU64() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1).
  double UniformDouble() { return (NextU64() >> 11) * 0x1.0p-53; }
  float UniformFloat() { return (NextU64() >> 40) * 0x1.0p-24f; }
  // Uniform in [lo, hi).
  float Uniform(float lo, float hi) { return lo + (hi - lo) * UniformFloat(); }
  // Uniform integer in [0, n), n > 0 (Lemire's method, no modulo bias).
  uint64_t Below(uint64_t n) {
    unsigned __int128 m = static_cast<unsigned __int128>(NextU64()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = -n % n;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(NextU64()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
  // Standard normal (Box-Muller, one value per call, no cached spare so the
  // state is only s_).
  double Normal() {
    double u1 = UniformDouble();
    double u2 = UniformDouble();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  using State = std::array<uint64_t, 4>;
  State state() const { return s_; }
  void set_state(const State& s) { s_ = s; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t SplitMix64(uint64_t* x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  State s_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CORE_RANDOM_H_
