// The packed GEMM's micro-kernels (AVX-512, AVX2, portable) and the choice
// among them; the loops around them are in packed_gemm.cc and
// packed_gemm_transposed.cc.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_kind.h"
#include "kernels/packed_gemm.h"
#include "kernels/packed_gemm_internal.h"

namespace trainyard {
namespace packed_internal {

namespace {

// This CPU's kernel: AVX-512 where it has AVX-512 (on full-width units,
// twice the AVX2 kernel's peak; on AMD Zen 4's 256-bit units the same peak,
// and 1.03-1.05 times the AVX2 kernel's samples/s in the training step at
// 32 to 128 rows over 18 rounds, about that machine's noise between
// variants: docs/BENCHMARKS.md, "A packed GEMM for small microbatches"),
// else AVX2, else the portable one.
PackedKernel CpuKernel() {
  if (!CpuHasAvx2Fma()) return PackedKernel::kPortable;
  if (CpuHasAvx512()) return PackedKernel::kAvx512;
  return PackedKernel::kAvx2;
}

// TRAINYARD_PACKED_GEMM, read once: unset or empty (the CPU's choice),
// "0" (off), "avx2", "avx512" or "portable" (on, that kernel if this CPU
// has it), anything else (on).
struct Config {
  bool enabled;
  PackedKernel kernel;
};

const Config& GetConfig() {
  static const Config config = [] {
    Config c{PackedGemmOnByDefault(), CpuKernel()};
    const char* env = std::getenv("TRAINYARD_PACKED_GEMM");
    if (env == nullptr || env[0] == '\0') return c;
    c.enabled = std::strcmp(env, "0") != 0;
    const std::optional<PackedKernel> named = PackedKernelNamed(env);
    if (named.has_value() && PackedKernelSupported(*named)) c.kernel = *named;
    return c;
  }();
  return config;
}

// A test's kernel (SetPackedKernelForTesting), or -1.
std::atomic<int> kernel_for_testing{-1};

}  // namespace

PackedKernel ActiveKernel() {
  const int forced = kernel_for_testing.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<PackedKernel>(forced) : GetConfig().kernel;
}

namespace {

// A kernel call's share of a Prefetch plan, one run of lines at a time:
// Next(k) says whether k steps remain to prefetch for, and sets the run
// that starts at step k: steps [k, end), whose lines start at `line`,
// `step` bytes apart.
class PrefetchRuns {
 public:
  PrefetchRuns(const Prefetch& plan, int64_t kb)
      : step(plan.step * static_cast<int64_t>(sizeof(float))),
        plan_(plan),
        n_(plan.base == nullptr ? 0 : std::min(kb, plan.count)),
        q_(plan.first) {}

  bool Next(int64_t k) {
    if (k >= n_) return false;
    const int64_t in_run = q_ % plan_.run;
    end = std::min(n_, k + plan_.run - in_run);
    line = reinterpret_cast<const char*>(
        plan_.base + q_ / plan_.run * plan_.stride + in_run * plan_.step);
    q_ += end - k;
    return true;
  }

  const int64_t step;
  int64_t end = 0;
  const char* line = nullptr;

 private:
  const Prefetch& plan_;
  const int64_t n_;
  int64_t q_;
};

// One k step of Avx2Kernel: row k of the B panel times R values of A.
template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void Avx2Step(
    int64_t k, const float* ap, const float* bp, __m256* lo, __m256* hi) {
  const __m256 b0 = _mm256_loadu_ps(bp + k * kNr);
  const __m256 b1 = _mm256_loadu_ps(bp + k * kNr + 8);
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i) {
    const __m256 av = _mm256_broadcast_ss(ap + k * R + i);
    lo[i] = _mm256_fmadd_ps(av, b0, lo[i]);
    hi[i] = _mm256_fmadd_ps(av, b1, hi[i]);
  }
}

// rows x 16 block of C (row stride ldc) from `rows` interleaved rows of A
// (ap[k * rows + i]) and one panel of B (bp[k * 16 + j]).
template <int R>
__attribute__((target("avx2,fma"))) void Avx2Kernel(int64_t kb, const float* ap,
                                                    const float* bp, float* c,
                                                    int64_t ldc, bool load,
                                                    const Prefetch& prefetch) {
  __m256 lo[R], hi[R];
  Avx2LoadTile<R>(c, ldc, load, lo, hi);
  int64_t k = 0;
  // One line of the next panel a step: it is in cache when its turn comes.
  // Into L2, not L1: with 32 rows the next panel's 16 KiB came in while the
  // current panel (16 KiB) and the row panels of A (up to 32 KiB) were
  // still being read from a 32 KiB L1. Measured on AMD Zen 4 (scratch
  // program, SgemmPacked from the packs of a step's 8 weights, the two
  // hints alternating in one process, 11 rounds): the L2 hint's time was
  // 0.85 of the L1 hint's at 32 rows (range 0.79-0.97), 1.00 at 64 and 1.01
  // at 128; when packing as it goes (the first microbatch), 0.95, 0.97 and
  // 1.01.
  for (PrefetchRuns run(prefetch, kb); run.Next(k);) {
#pragma GCC unroll 4
    for (; k < run.end; ++k) {
      _mm_prefetch(run.line, _MM_HINT_T1);
      run.line += run.step;
      Avx2Step<R>(k, ap, bp, lo, hi);
    }
  }
#pragma GCC unroll 4
  for (; k < kb; ++k) Avx2Step<R>(k, ap, bp, lo, hi);
  Avx2StoreTile<R>(lo, hi, c, ldc);
}

void Avx2Panel(int rows, int64_t kb, const float* ap, const float* bp, float* c,
               int64_t ldc, bool load, const Prefetch& prefetch) {
  static constexpr auto kKernels =
      RowTable<kMr>([](auto r) { return &Avx2Kernel<r()>; });
  kKernels[rows - 1](kb, ap, bp, c, ldc, load, prefetch);
}

// One k step of Avx512Kernel: row k of the B panel (one zmm) times R values
// of A, each broadcast from memory.
template <int R>
__attribute__((target("avx512f"), always_inline)) inline void Avx512Step(
    int64_t k, const float* ap, const float* bp, __m512* acc) {
  const __m512 b = _mm512_loadu_ps(bp + k * kNr);
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i) {
    acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(ap[k * R + i]), b, acc[i]);
  }
}

// Avx2Kernel with one zmm a row of C, for up to 12 rows: a k step is one
// load of B, R broadcasts and R fmas, so with 12 rows the two 512-bit FMA
// units of a full-width AVX-512 core have 12 independent chains to
// overlap. The prefetch plan is Avx2Kernel's.
template <int R>
__attribute__((target("avx512f"))) void Avx512Kernel(int64_t kb,
                                                     const float* ap,
                                                     const float* bp, float* c,
                                                     int64_t ldc, bool load,
                                                     const Prefetch& prefetch) {
  __m512 acc[R];
  Avx512LoadTile<R>(c, ldc, load, acc);
  int64_t k = 0;
  for (PrefetchRuns run(prefetch, kb); run.Next(k);) {
#pragma GCC unroll 4
    for (; k < run.end; ++k) {
      _mm_prefetch(run.line, _MM_HINT_T1);
      run.line += run.step;
      Avx512Step<R>(k, ap, bp, acc);
    }
  }
#pragma GCC unroll 4
  for (; k < kb; ++k) Avx512Step<R>(k, ap, bp, acc);
  Avx512StoreTile<R>(acc, c, ldc);
}

void Avx512Panel(int rows, int64_t kb, const float* ap, const float* bp,
                 float* c, int64_t ldc, bool load, const Prefetch& prefetch) {
  static constexpr auto kKernels =
      RowTable<kMaxMr>([](auto r) { return &Avx512Kernel<r()>; });
  kKernels[rows - 1](kb, ap, bp, c, ldc, load, prefetch);
}

// The same chains, one element at a time (any x86-64; std::fma rounds once
// as the vector instruction does).
void PortablePanel(int rows, int64_t kb, const float* ap, const float* bp,
                   float* c, int64_t ldc, bool load) {
  for (int i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < kNr; ++j) {
      float acc = load ? c[i * ldc + j] : 0.0f;
      for (int64_t k = 0; k < kb; ++k) {
        acc = std::fma(ap[k * rows + i], bp[k * kNr + j], acc);
      }
      c[i * ldc + j] = acc;
    }
  }
}

}  // namespace

void Panel(int rows, int64_t kb, const float* ap, const float* bp, float* c,
           int64_t ldc, bool load, const Prefetch& prefetch) {
  switch (ActiveKernel()) {
    case Kernel::kAvx512:
      return Avx512Panel(rows, kb, ap, bp, c, ldc, load, prefetch);
    case Kernel::kAvx2:
      return Avx2Panel(rows, kb, ap, bp, c, ldc, load, prefetch);
    case Kernel::kPortable:
      return PortablePanel(rows, kb, ap, bp, c, ldc, load);
  }
}

}  // namespace packed_internal

bool PackedGemmOnByDefault() { return CpuHasAvx2Fma(); }

bool PackedGemmEnabled() { return packed_internal::GetConfig().enabled; }

int64_t PackedGemmMaxRows() {
  return CpuHasAvx512() ? kPackedGemmMaxRows : kPackedGemmMaxRowsAvx2;
}

bool UsePackedGemm(int64_t rows) {
  return rows <= PackedGemmMaxRows() && PackedGemmEnabled();
}

bool PackedKernelSupported(PackedKernel kernel) {
  switch (kernel) {
    case PackedKernel::kPortable:
      return true;
    case PackedKernel::kAvx2:
      return CpuHasAvx2Fma();
    case PackedKernel::kAvx512:
      return CpuHasAvx2Fma() && CpuHasAvx512();
  }
  return false;
}

PackedKernel ActivePackedKernel() { return packed_internal::ActiveKernel(); }

std::optional<PackedKernel> PackedKernelNamed(std::string_view name) {
  if (name == "portable") return PackedKernel::kPortable;
  if (name == "avx2") return PackedKernel::kAvx2;
  if (name == "avx512") return PackedKernel::kAvx512;
  return std::nullopt;
}

const char* PackedKernelName(PackedKernel kernel) {
  switch (kernel) {
    case PackedKernel::kPortable:
      return "portable";
    case PackedKernel::kAvx2:
      return "AVX2";
    case PackedKernel::kAvx512:
      return "AVX-512";
  }
  return "?";
}

std::string PackedGemmDescription() {
  if (!PackedGemmEnabled()) return "packed GEMM: off";
  return absl::StrCat("packed GEMM: ", PackedKernelName(ActivePackedKernel()),
                      ", up to ", PackedGemmMaxRows(), " rows");
}

void SetPackedKernelForTesting(std::optional<PackedKernel> kernel) {
  packed_internal::kernel_for_testing.store(
      kernel.has_value() ? static_cast<int>(*kernel) : -1,
      std::memory_order_relaxed);
}

}  // namespace trainyard
