// One GEMM library behind a common row-major interface, for the GEMM
// library survey (gemm_libs.cc). Not part of the Bazel build.
//
// Each backend wraps one library as our kernels would call it: row-major
// fp32, C = op(A) op(B) + beta * C with alpha = 1 (kernels/blas.h's
// convention). A backend owns whatever it caches (primitives, JIT kernels,
// packed copies); callers own all matrices. Backends are not thread-safe:
// call them from one thread; they run their own threads inside.
#ifndef TRAINYARD_TOOLS_GEMM_LIBS_GEMM_BACKEND_H_
#define TRAINYARD_TOOLS_GEMM_LIBS_GEMM_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainyard {
namespace gemm_libs {

// A dense row-major GEMM: op(A) is [m, k], op(B) is [k, n], C is [m, n].
// A is [m, k] (or [k, m] when trans_a), B is [k, n] (or [n, k] when
// trans_b); leading dimensions are the stored row lengths.
struct GemmShape {
  bool trans_a;
  bool trans_b;
  int64_t m, n, k;

  int64_t lda() const { return trans_a ? m : k; }
  int64_t ldb() const { return trans_b ? k : n; }
  int64_t ldc() const { return n; }
  int64_t a_size() const { return m * k; }
  int64_t b_size() const { return k * n; }
  int64_t c_size() const { return m * n; }
  double flops() const { return 2.0 * m * n * k; }
};

class GemmBackend {
 public:
  virtual ~GemmBackend() = default;

  // Short name for tables, e.g. "blis".
  virtual std::string Name() const = 0;
  // Library, version and kernel family, e.g. "BLIS 0.9.0 (zen3)".
  virtual std::string Description() const = 0;
  // Threads later Gemm calls use; n >= 1.
  virtual void SetThreads(int n) = 0;
  // C = op(A) op(B) + beta * C (beta 0 overwrites C). Errors: Internal when
  // the library refuses the shape (the message names library and shape);
  // InvalidArgument for a beta the backend cannot express (oneDNN: 0 or 1).
  virtual absl::Status Gemm(const GemmShape& shape, const float* a,
                            const float* b, float beta, float* c) = 0;
};

// OpenBLAS as kernels/blas.cc calls it today: single-threaded OpenBLAS
// calls over a shape-only tiling of C on our thread pool.
absl::StatusOr<std::unique_ptr<GemmBackend>> NewOpenBlasTiledBackend();
// OpenBLAS's own threading: one cblas_sgemm with openblas_set_num_threads.
// Requires NewOpenBlasTiledBackend() to have loaded the library first.
absl::StatusOr<std::unique_ptr<GemmBackend>> NewOpenBlasNativeBackend();
// BLIS's typed API (bli_sgemm with row/column strides), BLIS's threading.
absl::StatusOr<std::unique_ptr<GemmBackend>> NewBlisBackend();
// oneDNN matmul, one primitive per shape and thread count, strided
// memory descriptors for the transposes, a sum post-op for beta = 1.
absl::StatusOr<std::unique_ptr<GemmBackend>> NewOneDnnBackend();
// oneDNN matmul on kernels/blas.h's tiling, one single-threaded call a
// tile on our compute pool (as Sgemm runs OpenBLAS): bits that cannot
// depend on the thread count.
absl::StatusOr<std::unique_ptr<GemmBackend>> NewOneDnnTiledBackend();
// libxsmm JIT kernels over a shape-only tiling of C (each tile one chain
// of kernels over k in a fixed order), OpenMP over tiles. libxsmm 1.17's
// JIT has no transposed-A kernel, so NT shapes transpose B first: per
// call, or, with pack_once, once per B pointer (weights packed once per
// step; valid only while B's contents do not change).
absl::StatusOr<std::unique_ptr<GemmBackend>> NewLibxsmmBackend(bool pack_once);
// Our packed GEMM (kernels/packed_gemm.h) as the MLP blocks call it on this
// CPU's default kernel; with pack_once W's pack is kept per B pointer (as
// libxsmm's), else every call packs (packed_backend.cc says how).
absl::StatusOr<std::unique_ptr<GemmBackend>> NewPackedBackend(bool pack_once);

// fc1 with its bias and GELU (erf): out [m, n] = gelu(a [m, k] w^T + bias),
// w [n, k], bias [n], as one oneDNN matmul with a bias and an eltwise
// post-op. Owns its primitives; one thread at a time.
class FusedLinearGelu {
 public:
  virtual ~FusedLinearGelu() = default;
  virtual void SetThreads(int n) = 0;
  virtual absl::Status Run(int64_t m, int64_t n, int64_t k, const float* a,
                           const float* w, const float* bias, float* out) = 0;
};
absl::StatusOr<std::unique_ptr<FusedLinearGelu>> NewOneDnnFusedLinearGelu();

}  // namespace gemm_libs
}  // namespace trainyard

#endif  // TRAINYARD_TOOLS_GEMM_LIBS_GEMM_BACKEND_H_
