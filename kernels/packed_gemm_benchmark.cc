// The forward and input-gradient GEMMs of a training step (4 blocks, h =
// 1024, ffn = 4096; batch 256 in M microbatches of 256 / M rows) through
// OpenBLAS (kernels/blas.h, as the block runs it for larger microbatches)
// and through the packed GEMM (kernels/packed_gemm.h) as the block runs it
// for small ones (the first microbatch's forward GEMMs pack each weight,
// W^T, while they compute; every other GEMM reads the packs, the input
// gradients through SgemmPackedTransposed), alternating in one process, the
// order swapped every round. One line per M: medians and the median of the
// per-round ratios packed / OpenBLAS.
//
//   bazel build //kernels:packed_gemm_benchmark
//   bazel-bin/kernels/packed_gemm_benchmark --microbatches=1,4,5,6,8
//
// --prepacked packs every weight before timing instead (the kernel alone).
// --weight_gradients times the step's weight-gradient GEMMs instead (fc1's
// and fc2's per block): OpenBLAS once a microbatch, accumulating, as the
// block runs it for larger microbatches, against SgemmWeightGradient over
// all microbatches in one call per weight (the chained accumulation), or,
// with --per_microbatch, one call a microbatch.
//
// --peak prints this CPU's FMA peak instead: 12 independent fma chains a
// thread, on ymm (AVX2 and FMA) and zmm (AVX-512) registers, 1 thread and
// --threads threads; the ceiling the GEMMs' GFLOP/s are to be read against
// (the SGEMM ceiling is OpenBLAS's, which need not reach it).
//
// --kernel picks the packed GEMM's micro-kernel (avx512, avx2 or portable;
// default: this CPU's), and --baseline=KERNEL compares it with the packed
// GEMM on another kernel instead of OpenBLAS, e.g.
//
//   bazel-bin/kernels/packed_gemm_benchmark --kernel=avx512 --baseline=avx2
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/blas.h"
#include "kernels/cpu_kind.h"
#include "kernels/mlp_block.h"
#include "kernels/packed_gemm.h"
#include "kernels/parallel.h"

ABSL_FLAG(std::vector<std::string>, microbatches,
          std::vector<std::string>({"1", "4", "8"}),
          "microbatch counts M (rows 256 / M).");
ABSL_FLAG(int, rounds, 9, "timed rounds per M and library.");
ABSL_FLAG(int, threads, 2, "compute threads.");
ABSL_FLAG(bool, prepacked, false,
          "time the packed GEMM with every weight packed beforehand.");
ABSL_FLAG(bool, weight_gradients, false,
          "time the weight-gradient GEMMs instead.");
ABSL_FLAG(std::string, kernel, "",
          "the packed GEMM's kernel: avx512, avx2 or portable (default: this "
          "CPU's).");
ABSL_FLAG(std::string, baseline, "openblas",
          "what the packed GEMM is compared with: openblas, or the packed GEMM "
          "on another kernel (avx512, avx2, portable).");
ABSL_FLAG(bool, peak, false,
          "print this CPU's FMA peak (ymm and zmm, 1 and --threads threads) "
          "instead.");
ABSL_FLAG(bool, per_microbatch, false,
          "with --weight_gradients: the packed GEMM once a microbatch, not "
          "chained.");

namespace trainyard {
namespace {

constexpr int64_t kHidden = 1024, kFfn = 4096, kBatch = 256, kBlocks = 4;

#define CHECK_OK(expr)                                      \
  do {                                                      \
    const absl::Status _st = (expr);                        \
    if (!_st.ok()) {                                        \
      std::fprintf(stderr, "%s\n", _st.ToString().c_str()); \
      std::abort();                                         \
    }                                                       \
  } while (0)

// Buffers come from the host allocator, as a stage's tensors do (large
// ones on huge pages, core/allocator.h), so the GEMMs read memory as in a
// step.
Tensor Zeros(int64_t n) { return Tensor::Zeros(DType::kFloat32, {n}); }

Tensor Random(int64_t n, Rng& rng) {
  Tensor t = Zeros(n);
  float* v = t.data<float>();
  for (int64_t i = 0; i < n; ++i) v[i] = rng.Uniform(-1.0f, 1.0f);
  return t;
}

double Seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Compare(int microbatches, int rounds, const char* what,
             const std::function<void()>& openblas,
             const std::function<void()>& packed);

void RunM(int microbatches, int rounds, bool prepacked) {
  const int64_t h = kHidden, f = kFfn, mb = kBatch / microbatches;
  Rng rng(1);
  using Buffers = std::vector<Tensor>;
  Buffers w1, w2, x, act, dy, pre, y, dact, dx;
  for (int l = 0; l < kBlocks; ++l) {
    w1.push_back(Random(f * h, rng));
    w2.push_back(Random(h * f, rng));
  }
  for (int i = 0; i < microbatches; ++i) {
    x.push_back(Random(mb * h, rng));
    act.push_back(Random(mb * f, rng));
    dy.push_back(Random(mb * h, rng));
    pre.push_back(Zeros(mb * f));
    y.push_back(Zeros(mb * h));
    dact.push_back(Zeros(mb * f));
    dx.push_back(Zeros(mb * h));
  }
  // Per block: fc1 forward, fc2 forward, fc2 input gradient, fc1 input
  // gradient.
  const auto openblas = [&] {
    for (int i = 0; i < microbatches; ++i) {
      for (int l = 0; l < kBlocks; ++l) {
        CHECK_OK(Sgemm(false, true, mb, f, h, 1, x[i].data<float>(), h,
                       w1[l].data<float>(), h, 0, pre[i].data<float>(), f));
        CHECK_OK(Sgemm(false, true, mb, h, f, 1, act[i].data<float>(), f,
                       w2[l].data<float>(), f, 0, y[i].data<float>(), h));
        CHECK_OK(Sgemm(false, false, mb, f, h, 1, dy[i].data<float>(), h,
                       w2[l].data<float>(), f, 0, dact[i].data<float>(), f));
        CHECK_OK(Sgemm(false, false, mb, h, f, 1, dact[i].data<float>(), f,
                       w1[l].data<float>(), h, 0, dx[i].data<float>(), h));
      }
    }
  };
  struct Gemm {
    bool trans;
    int64_t n, k;
  };
  const Gemm shapes[4] = {
      {true, f, h}, {true, h, f}, {false, f, h}, {false, h, f}};
  // As the block runs them (MlpWeightGemm): one pack a weight, W^T, made
  // by the first microbatch's forward GEMM and read by every later GEMM of
  // the step, the input gradients included.
  std::vector<MlpBlockPacked> packs(kBlocks);
  const auto packed = [&] {
    if (!prepacked) {
      for (MlpBlockPacked& p : packs) p.Reset();
    }
    for (int i = 0; i < microbatches; ++i) {
      for (int l = 0; l < kBlocks; ++l) {
        const float* in[4] = {x[i].data<float>(), act[i].data<float>(),
                              dy[i].data<float>(), dact[i].data<float>()};
        float* out[4] = {pre[i].data<float>(), y[i].data<float>(),
                         dact[i].data<float>(), dx[i].data<float>()};
        const float* w[4] = {w1[l].data<float>(), w2[l].data<float>(),
                             w2[l].data<float>(), w1[l].data<float>()};
        MlpBlockPacked::Weight* slot[4] = {&packs[l].fc1, &packs[l].fc2,
                                           &packs[l].fc2, &packs[l].fc1};
        // MlpWeightGemm's calls, at any row count (M = 1 included).
        for (int g = 0; g < 4; ++g) {
          const Gemm& s = shapes[g];
          MlpBlockPacked::Weight& pack = *slot[g];
          if (pack.ready) {
            CHECK_OK(s.trans
                         ? SgemmPacked(mb, in[g], s.k, pack.matrix, false,
                                       out[g], s.n)
                         : SgemmPackedTransposed(mb, in[g], s.k, pack.matrix,
                                                 false, out[g], s.n));
            continue;
          }
          const bool keep = s.trans && microbatches > 1;
          CHECK_OK(SgemmPacking(mb, s.n, s.k, in[g], s.k, s.trans, w[g],
                                s.trans ? s.k : s.n, false, out[g], s.n, {},
                                keep ? &pack.matrix : nullptr));
          pack.ready = keep;
        }
      }
    }
  };
  if (prepacked) {
    for (int l = 0; l < kBlocks; ++l) {
      CHECK_OK(packs[l].fc1.matrix.Pack(true, h, f, w1[l].data<float>(), h));
      CHECK_OK(packs[l].fc2.matrix.Pack(true, f, h, w2[l].data<float>(), f));
      packs[l].fc1.ready = packs[l].fc2.ready = true;
    }
  }
  Compare(microbatches, rounds, prepacked ? ", prepacked" : "", openblas,
          packed);
}

// The step's weight gradients: per block fc2.weight [h, f] += dy^T act and
// fc1.weight [f, h] += d(pre)^T x, over the microbatches.
void RunWeightGradients(int microbatches, int rounds, bool per_microbatch) {
  const int64_t h = kHidden, f = kFfn, mb = kBatch / microbatches;
  Rng rng(2);
  std::vector<Tensor> x, act, dy, dpre, g1, g2;
  for (int i = 0; i < microbatches; ++i) {
    x.push_back(Random(mb * h, rng));
    act.push_back(Random(mb * f, rng));
    dy.push_back(Random(mb * h, rng));
    dpre.push_back(Random(mb * f, rng));
  }
  for (int l = 0; l < kBlocks; ++l) {
    g1.push_back(Zeros(f * h));
    g2.push_back(Zeros(h * f));
  }
  const auto openblas = [&] {
    for (int i = 0; i < microbatches; ++i) {
      for (int l = 0; l < kBlocks; ++l) {
        const float beta = i > 0 ? 1.0f : 0.0f;
        CHECK_OK(Sgemm(true, false, h, f, mb, 1, dy[i].data<float>(), h,
                       act[i].data<float>(), f, beta, g2[l].data<float>(), f));
        CHECK_OK(Sgemm(true, false, f, h, mb, 1, dpre[i].data<float>(), f,
                       x[i].data<float>(), h, beta, g1[l].data<float>(), h));
      }
    }
  };
  std::vector<GradientRows> fc2_parts, fc1_parts;
  for (int i = 0; i < microbatches; ++i) {
    fc2_parts.push_back({mb, dy[i].data<float>(), h, act[i].data<float>(), f});
    fc1_parts.push_back({mb, dpre[i].data<float>(), f, x[i].data<float>(), h});
  }
  const auto packed = [&] {
    const int calls = per_microbatch ? microbatches : 1;
    const int per = microbatches / calls;
    for (int i = 0; i < calls; ++i) {
      for (int l = 0; l < kBlocks; ++l) {
        const absl::Span<const GradientRows> p2(fc2_parts.data() + i * per,
                                                per);
        const absl::Span<const GradientRows> p1(fc1_parts.data() + i * per,
                                                per);
        CHECK_OK(SgemmWeightGradient(h, f, p2, i > 0, g2[l].data<float>(), f));
        CHECK_OK(SgemmWeightGradient(f, h, p1, i > 0, g1[l].data<float>(), h));
      }
    }
  };
  Compare(microbatches, rounds,
          per_microbatch ? ", weight gradients, per microbatch"
                         : ", weight gradients, chained",
          openblas, packed);
}

// A kernel named on the command line (as TRAINYARD_PACKED_GEMM names it),
// if this CPU has it; else the program exits.
PackedKernel KernelNamed(const std::string& name) {
  const std::optional<PackedKernel> k = PackedKernelNamed(name);
  if (!k.has_value()) {
    std::fprintf(stderr, "unknown kernel '%s'\n", name.c_str());
    std::exit(2);
  }
  if (!PackedKernelSupported(*k)) {
    std::fprintf(stderr, "this CPU cannot run the %s kernel\n",
                 PackedKernelName(*k));
    std::exit(2);
  }
  return *k;
}

// The packed GEMM's kernel (--kernel), and the baseline's when it is the
// packed GEMM on another kernel (--baseline).
std::optional<PackedKernel> TestedKernel() {
  const std::string name = absl::GetFlag(FLAGS_kernel);
  if (name.empty()) return std::nullopt;
  return KernelNamed(name);
}

// Times the baseline (OpenBLAS, or the packed GEMM on --baseline's kernel)
// and the packed GEMM alternately, the order swapped every round; prints
// medians, GFLOP/s over the step's flops of one GEMM kind set (16 or 8
// GEMMs: taken from the caller's batch) and the ratio.
void Compare(int microbatches, int rounds, const char* what,
             const std::function<void()>& openblas_fn,
             const std::function<void()>& packed_fn) {
  const int64_t h = kHidden, f = kFfn, mb = kBatch / microbatches;
  const std::string base_name = absl::GetFlag(FLAGS_baseline);
  const std::optional<PackedKernel> tested = TestedKernel();
  std::function<void()> openblas = openblas_fn;
  std::string label = "OpenBLAS";
  if (base_name != "openblas") {
    const PackedKernel k = KernelNamed(base_name);
    label = std::string("packed ") + PackedKernelName(k);
    openblas = [&, k] {
      SetPackedKernelForTesting(k);
      packed_fn();
    };
  }
  const auto packed = [&] {
    SetPackedKernelForTesting(tested);
    packed_fn();
  };
  SetPackedKernelForTesting(tested);
  const std::string packed_label =
      std::string("packed ") + PackedKernelName(ActivePackedKernel());
  openblas();  // warm up both, allocating every buffer
  packed();
  std::vector<double> a, b, ratio;
  for (int r = 0; r < rounds; ++r) {
    double ta, tb;
    if (r % 2 == 0) {
      ta = Seconds(openblas);
      tb = Seconds(packed);
    } else {
      tb = Seconds(packed);
      ta = Seconds(openblas);
    }
    a.push_back(ta);
    b.push_back(tb);
    ratio.push_back(tb / ta);
  }
  const double gemms =
      std::string(what).find("weight") != std::string::npos ? 2.0 : 4.0;
  const double flops = gemms * 2 * kBatch * h * f * kBlocks;
  std::sort(ratio.begin(), ratio.end());
  SetPackedKernelForTesting(std::nullopt);
  std::printf(
      "M=%d (%lld rows)%s: %s %.1f ms (%.0f GFLOP/s), %s %.1f ms "
      "(%.0f GFLOP/s), ratio median %.3f (range %.3f-%.3f)\n",
      microbatches, static_cast<long long>(mb), what, label.c_str(),
      1e3 * Median(a), 1e-9 * flops / Median(a), packed_label.c_str(),
      1e3 * Median(b), 1e-9 * flops / Median(b), Median(ratio), ratio.front(),
      ratio.back());
  std::fflush(stdout);
}

// kChains independent fma chains (acc = acc * m + a: bounded, never
// subnormal) of one register width, `iters` steps each, left in `out`
// (kChains registers' floats) so that the work is kept. 12 chains cover
// two FMA units of latency 4 or more than the 8 they need.
constexpr int kChains = 12;

__attribute__((target("avx2,fma"), noinline)) void FmaChainsYmm(int64_t iters,
                                                                float* out) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(0.01f * i);
  const __m256 m = _mm256_set1_ps(0.999f), a = _mm256_set1_ps(1e-4f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, a);
  }
  for (int i = 0; i < kChains; ++i) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

__attribute__((target("avx512f"), noinline)) void FmaChainsZmm(int64_t iters,
                                                               float* out) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(0.01f * i);
  const __m512 m = _mm512_set1_ps(0.999f), a = _mm512_set1_ps(1e-4f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, a);
  }
  for (int i = 0; i < kChains; ++i) _mm512_storeu_ps(out + 16 * i, acc[i]);
}

// GFLOP/s of `chains` (one of the above, `lanes` floats a register) on
// `threads` threads at once, the best of 5 runs of about 0.2 s.
double PeakGflops(void (*chains)(int64_t, float*), int lanes, int threads) {
  constexpr int64_t kIters = int64_t{1} << 24;
  std::vector<float> out(int64_t{threads} * kChains * lanes);
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    const double s = Seconds([&] {
      ParallelFor(threads, [&](int t) {
        chains(kIters, out.data() + int64_t{t} * kChains * lanes);
      });
    });
    best = std::max(best, 2.0 * kChains * lanes * kIters * threads / s);
  }
  static volatile float sink;
  for (float x : out) sink = sink + x;
  return 1e-9 * best;
}

void PrintPeak(int threads) {
  for (int t : {1, threads}) {
    std::printf("FMA peak, %d thread%s:", t, t == 1 ? "" : "s");
    if (CpuHasAvx2Fma()) {
      std::printf(" ymm %.1f GFLOP/s", PeakGflops(&FmaChainsYmm, 8, t));
    }
    if (CpuHasAvx512()) {
      std::printf(", zmm %.1f GFLOP/s", PeakGflops(&FmaChainsZmm, 16, t));
    }
    std::printf("\n");
    std::fflush(stdout);
    if (threads == 1) break;
  }
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  trainyard::SetComputeThreads(absl::GetFlag(FLAGS_threads));
  std::printf("%s; %s\n", trainyard::BlasDescription().c_str(),
              trainyard::PackedGemmDescription().c_str());
  if (absl::GetFlag(FLAGS_peak)) {
    trainyard::PrintPeak(absl::GetFlag(FLAGS_threads));
    return 0;
  }
  for (const std::string& m : absl::GetFlag(FLAGS_microbatches)) {
    if (absl::GetFlag(FLAGS_weight_gradients)) {
      trainyard::RunWeightGradients(std::stoi(m), absl::GetFlag(FLAGS_rounds),
                                    absl::GetFlag(FLAGS_per_microbatch));
    } else {
      trainyard::RunM(std::stoi(m), absl::GetFlag(FLAGS_rounds),
                      absl::GetFlag(FLAGS_prepacked));
    }
  }
  return 0;
}
