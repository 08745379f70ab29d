// A single-precision GEMM of our own whose right-hand operand is packed once
// and then used by many calls: a layer's weights, packed at the start of a
// training step and read by every microbatch's forward and input-gradient
// GEMMs. OpenBLAS packs the weights again inside each call, which at 32 to
// 128 rows a microbatch costs up to a third of the GEMM's time.
//
// The rounding is defined, not just repeatable: every element of C is one
// fused multiply-add chain over k in ascending order,
//
//   c = accumulate ? C[i][j] : 0;
//   for k in 0..K-1: c = fma(A[i][k], B[k][j], c)
//
// so its bits depend on that row of A and that column of B only: not on the
// number of rows (a microbatch's size), the thread count, the tiling or the
// CPU's vector width. The AVX-512 and AVX2 kernels and the portable one
// (any x86-64) give the same bits; packed_gemm_test checks each this CPU
// can run against that loop.
//
// Thread safety: a PackedMatrix may be read by any number of concurrent
// SgemmPacked calls; Pack must not run concurrently with them.
#ifndef TRAINYARD_KERNELS_PACKED_GEMM_H_
#define TRAINYARD_KERNELS_PACKED_GEMM_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/blas.h"
#include "kernels/packed_gemm_rows.h"

namespace trainyard {

// op(B) [k, n] in the layout SgemmPacked reads: 256-row blocks of k, each
// cut into 16-column panels (the last one padded with zeros).
class PackedMatrix {
 public:
  PackedMatrix() = default;
  PackedMatrix(PackedMatrix&&) = default;
  PackedMatrix& operator=(PackedMatrix&&) = default;

  // Packs op(B) [k, n] from row-major b: b is [n, k] (ldb >= k) and op(B) =
  // b^T when trans (a [out, in] weight for y = x W^T), else b is [k, n]
  // (ldb >= n). Reuses the buffer when it is big enough. Threaded over
  // panels. Errors: InvalidArgument for negative sizes or a leading
  // dimension too small; ResourceExhausted when the buffer cannot be
  // allocated (naming its size).
  absl::Status Pack(bool trans, int64_t k, int64_t n, const float* b,
                    int64_t ldb);

  // Sizes the buffer for op(B) [k, n] without filling it (SgemmPacking
  // fills it). Errors as Pack's.
  absl::Status Reserve(int64_t k, int64_t n);

  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  // Bytes held (capacity of the buffer).
  int64_t bytes() const {
    return capacity_ * static_cast<int64_t>(sizeof(float));
  }
  const float* data() const { return data_.get(); }
  float* mutable_data() { return data_.get(); }

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::unique_ptr<float[], Free> data_;
  int64_t capacity_ = 0;  // floats
  int64_t k_ = 0, n_ = 0;
};

// C [m, n] = A [m, k] * op(B) (accumulate = false) or C + A * op(B)
// (accumulate = true), with the rounding in the header comment; then
// `epilogue` (may be empty) on each block of C as it is finished, on the
// thread that finished it (blas.h's GemmEpilogue: the blocks partition C and
// depend on (m, n, k) only). A is row-major with lda >= k. Threaded over
// column blocks on the compute pool (kernels/parallel.h). Errors:
// InvalidArgument for a negative m, lda < k, or ldc < n.
absl::Status SgemmPacked(int64_t m, const float* a, int64_t lda,
                         const PackedMatrix& b, bool accumulate, float* c,
                         int64_t ldc, const GemmEpilogue& epilogue = {});

// SgemmPacked with op(B) [k, n] read from row-major b ([n, k] when trans_b,
// else [k, n]) and packed panel by panel as the GEMM reaches it (no
// separate pass over b), into a 16 KiB buffer, and, with `keep`, also
// into *keep (sized by Reserve; streaming stores), which then holds all of
// op(B) for later SgemmPacked calls: the first microbatch packs the weights for
// the others while it computes. The same bits as packing b first. Errors: as
// SgemmPacked, and as PackedMatrix::Pack for n, k and ldb.
absl::Status SgemmPacking(int64_t m, int64_t n, int64_t k, const float* a,
                          int64_t lda, bool trans_b, const float* b,
                          int64_t ldb, bool accumulate, float* c, int64_t ldc,
                          const GemmEpilogue& epilogue = {},
                          PackedMatrix* keep = nullptr);

// C [m, b.k()] = A [m, b.n()] * op(B)^T (accumulate = false) or C + that
// (accumulate = true): a layer's input gradient dx = dy W read from the
// pack its forward GEMM made (op(B) = W^T), so a layer needs one pack, not
// one a GEMM. Every element of C is one fma chain over the pack's n in
// ascending order, c = fma(A[i][q], op(B)[j][q], c): the bits of
// SgemmPacked on W packed as is. `epilogue` as SgemmPacked's, on column
// blocks that depend on (m, b.k(), b.n()) only. Errors: InvalidArgument for
// a negative m, lda < b.n(), or ldc < b.k().
absl::Status SgemmPackedTransposed(int64_t m, const float* a, int64_t lda,
                                   const PackedMatrix& b, bool accumulate,
                                   float* c, int64_t ldc,
                                   const GemmEpilogue& epilogue = {});

// One microbatch's rows of a weight gradient: dy [rows, m] (ld_dy >= m),
// the gradient of the layer's output, and x [rows, n] (ld_x >= n), its
// input.
struct GradientRows {
  int64_t rows = 0;
  const float* dy = nullptr;
  int64_t ld_dy = 0;
  const float* x = nullptr;
  int64_t ld_x = 0;
};

// A layer's weight gradient over microbatches: C [m, n] = (accumulate ? C :
// 0) + sum over the parts of dy^T x, with the rounding in the header
// comment for A = dy^T and B = x stacked over the parts in order (k = all
// their rows). So one call over several parts gives the bits of one call
// per part, in order, each after the first accumulating: a step's
// microbatches chained into one accumulation, the gradient read and
// written once instead of once a microbatch. Threaded as SgemmPacked.
// Errors: InvalidArgument naming the part for negative rows, a null
// pointer or a leading dimension too small, and for ldc < n;
// ResourceExhausted when the packing buffers cannot be allocated.
absl::Status SgemmWeightGradient(int64_t m, int64_t n,
                                 absl::Span<const GradientRows> parts,
                                 bool accumulate, float* c, int64_t ldc);

// Whether the MLP blocks use the packed GEMM by default on this CPU: on
// every CPU with AVX2 and FMA. It was measured faster than OpenBLAS at 32
// to 128 rows (docs/BENCHMARKS.md, "A packed GEMM for small microbatches")
// on AMD Zen 3 (AVX2), AMD Zen 4 (AVX-512 on 256-bit units, cpu_kind.h)
// and an Intel Xeon with full-width AVX-512 (OpenBLAS's SkylakeX kernels),
// where it took a step from 62% to 86% of the SGEMM ceiling in 64-row
// microbatches and from 44% to 70% in 32-row ones.
bool PackedGemmOnByDefault();

// Whether the MLP blocks may use the packed GEMM: for their forward and
// input-gradient GEMMs and their weight gradients. Default:
// PackedGemmOnByDefault(). The environment variable
// TRAINYARD_PACKED_GEMM overrides it: "0" off; "1" on; "avx2", "avx512" or
// "portable" on with that kernel (where the CPU has it). It is read once per
// process. The packed GEMM changes rounding against OpenBLAS, so a job's
// bits depend on whether it is on (as on OpenBLAS's kernels); its kernels
// all give the same bits.
bool PackedGemmEnabled();

// The most rows a GEMM of the blocks runs on the packed GEMM on this CPU:
// kPackedGemmMaxRows (256) where it has AVX-512, else
// kPackedGemmMaxRowsAvx2 (128) (packed_gemm_rows.h). It follows the CPU,
// not the kernel TRAINYARD_PACKED_GEMM picks, so that picking a kernel
// never changes a bit; between CPUs with and without AVX-512, GEMMs of 129
// to 256 rows round differently (the packed GEMM against OpenBLAS).
int64_t PackedGemmMaxRows();

// Whether the block's GEMMs over `rows` rows use the packed GEMM:
// PackedGemmEnabled() && rows <= PackedGemmMaxRows().
bool UsePackedGemm(int64_t rows);

// The packed GEMM's micro-kernels. Default: AVX-512 (12 rows x 16 columns,
// one zmm a row) on CPUs with AVX-512, AVX2 (6 x 16) on the other CPUs with
// AVX2 and FMA, else portable C++.
enum class PackedKernel { kPortable, kAvx2, kAvx512 };

// Whether this CPU can run `kernel`.
bool PackedKernelSupported(PackedKernel kernel);

// The kernel the packed GEMM runs now.
PackedKernel ActivePackedKernel();

// The kernel TRAINYARD_PACKED_GEMM calls `name` ("portable", "avx2",
// "avx512"), or nullopt.
std::optional<PackedKernel> PackedKernelNamed(std::string_view name);

// "portable", "AVX2" or "AVX-512".
const char* PackedKernelName(PackedKernel kernel);

// E.g. "packed GEMM: AVX2, up to 128 rows" or "packed GEMM: off".
std::string PackedGemmDescription();

// Tests and benchmarks: run `kernel` (PackedKernelSupported) from now on,
// or the default again with nullopt. Not while a packed GEMM runs.
void SetPackedKernelForTesting(std::optional<PackedKernel> kernel);

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_PACKED_GEMM_H_
