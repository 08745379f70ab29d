// GemmLt: row-major GEMM on the device through cuBLASLt, with the fused
// epilogues the MLP needs.
//
//   D [m, n] = alpha * op(A) [m, k] @ op(B) [k, n] + beta * C [m, n]
//
// All matrices are row-major with leading dimensions in elements (like
// kernels/blas.h): A is [m, k] (lda >= k) or, with trans_a, [k, m]
// (lda >= m); likewise B. cuBLASLt is column-major, so the call is issued
// as D^T = op(B)^T op(A)^T, which reads the same memory.
//
// Precision: kFloat32 (fp32 inputs, fp32 compute), kTf32 (fp32 inputs,
// CUBLAS_COMPUTE_32F_FAST_TF32: inputs rounded to TF32 in the tensor
// cores), kBFloat16 (bf16 inputs, fp32 accumulate). D and C share
// `d_type`: DType::kFloat32 or DType::kBFloat16 (bf16 only with kBFloat16;
// any other DType is InvalidArgument naming it). Bias vectors are float32.
//
// Epilogues (cuBLASLt's, named here in row-major terms):
//   kBias             D = AB + bias[n] (broadcast over rows)
//   kReluBias         D = relu(AB + bias)
//   kGeluTanhBias     D = gelu_tanh(AB + bias). cuBLASLt's GELU is the TANH
//                     approximation (torch approximate="tanh"); exact-erf
//                     "gelu" has no epilogue and uses elementwise_kernels.
//   kReluAuxBias      as kReluBias, and aux <- a BITMASK of (AB+bias > 0)
//                     in cuBLASLt's RELU_AUX format, read only by kDRelu /
//                     kDReluBiasGrad: ld_aux is in bits (>= n, a multiple
//                     of 128), the buffer holds m * ld_aux / 8 bytes.
//   kGeluTanhAuxBias  as kGeluTanhBias, and aux [m, ld_aux] <- AB + bias
//                     (the pre-activation, d_type), ld_aux a multiple of 8.
//   kReluAux, kGeluTanhAux  the same without bias.
//   kDRelu            D = AB * relu'(aux bitmask).
//   kDGeluTanh        D = AB * gelu_tanh'(aux), aux the pre-activation.
//   kDReluBiasGrad    as kDRelu, and bias_grad[n] = column sums of D
//                     (float32).
//   kDGeluTanhBiasGrad as kDGeluTanh, and bias_grad[n] = column sums of D.
//   kBiasGradA        D = AB; bias_grad[m] = sum over k of op(A) (the bias
//                     gradient of a weight-gradient GEMM: dW = dY^T X with
//                     A = dY, trans_a). cuBLASLt's BGRADB.
// The bias-gradient epilogues overwrite bias_grad (no accumulation).
// Whether cuBLASLt has an algorithm for an epilogue depends on the shapes,
// alignments (of every pointer, bias and aux included) and operations;
// when it has none, or ld_aux breaks the multiple-of-8 / multiple-of-128
// rule, Run returns Unimplemented and enqueues nothing, and callers fall
// back to separate kernels.
//
// Each distinct problem (shapes, types, transposes, epilogue, alignments of
// every pointer) is planned once: layouts, descriptors and an algorithm are
// cached, so a problem always runs the same algorithm. The algorithm is
// tuned: cuBLASLt's heuristic is asked for its top kTuneCandidates, each
// is run once to warm it and once timed with CUDA events, and the fastest
// is kept (only algorithms whose split-K reduction, if any, is a separate
// deterministic step: the heuristic is told to leave out the in-place
// reduction scheme). The choice is cached per GPU model (name, SM count,
// cuBLASLt version) in the process and in a file (gemm_algo_cache.h:
// TRAINYARD_GEMM_CACHE, or $HOME/.cache/trainyard/gemm_algos.tsv), so later
// runs, and later processes, pick the same algorithm for the same problem:
// results are bitwise repeatable once the cache holds a job's problems.
// Only problems with beta == 0 are tuned (tuning runs overwrite D); the
// others, and every problem with TRAINYARD_GEMM_TUNE=0, take the
// heuristic's first choice. Tuning a problem synchronises the stream (once
// per problem).
//
// Determinism: cuBLAS documents bitwise run-to-run reproducibility of its
// routines for one toolkit version, GPU architecture and SM count when
// each stream has its own workspace (ours: one GemmLt per stream, its own
// workspace). The bias-gradient epilogues are part of cublasLtMatmul and
// are covered by that statement as we read it; NVIDIA does not document
// their reduction order separately, so this is not independently verified,
// and their sums do not equal ColumnSums' bit for bit. The workspace
// (32 MiB) comes from the DeviceAllocator.
//
// Thread safety: not thread-safe; use one GemmLt per thread/stream.
#ifndef TRAINYARD_KERNELS_CUDA_GEMM_LT_H_
#define TRAINYARD_KERNELS_CUDA_GEMM_LT_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"

namespace trainyard {
namespace gpu {

enum class GemmPrecision { kFloat32, kTf32, kBFloat16 };
const char* GemmPrecisionName(GemmPrecision p);

enum class GemmEpilogue {
  kNone,
  kBias,
  kReluBias,
  kGeluTanhBias,
  kReluAuxBias,
  kGeluTanhAuxBias,
  kDReluBiasGrad,
  kDGeluTanhBiasGrad,
  kBiasGradA,
  kReluAux,
  kGeluTanhAux,
  kDRelu,
  kDGeluTanh,
};
const char* GemmEpilogueName(GemmEpilogue e);

struct GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  GemmPrecision precision = GemmPrecision::kFloat32;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  const void* c = nullptr;  // read when beta != 0; may equal d
  int64_t ldc = 0;
  void* d = nullptr;
  int64_t ldd = 0;
  DType d_type = DType::kFloat32;  // type of C and D
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  const float* bias = nullptr;  // [n], forward bias epilogues
  float* bias_grad = nullptr;   // [n] or [m] (kBiasGradA), gradient epilogues
  void* aux = nullptr;          // aux epilogues, see above
  int64_t ld_aux = 0;
};

class GemmLt {
 public:
  // A cuBLASLt handle and workspace on `device`. Errors: no device, built
  // without CUDA, cuBLASLt initialisation failure.
  static absl::StatusOr<std::unique_ptr<GemmLt>> Create(int device);
  ~GemmLt();

  // Enqueues the GEMM on `stream`. Errors: InvalidArgument for bad sizes,
  // leading dimensions, missing pointers or type combinations (naming the
  // field); Unimplemented (nothing enqueued) when cuBLASLt has no algorithm
  // for the problem or ld_aux breaks cuBLASLt's rule; cuBLAS errors
  // otherwise.
  absl::Status Run(const GemmArgs& args, Stream stream);

  // Number of planned problems (for tests of the cache).
  int64_t cached_plans() const;

  // Candidates timed when a problem is tuned.
  static constexpr int kTuneCandidates = 8;

 private:
  struct Impl;
  explicit GemmLt(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_GEMM_LT_H_
