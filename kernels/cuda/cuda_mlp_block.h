// CudaMlpBlock: kernels/mlp_block.h's MlpBlock on a CUDA device, with the
// same contract (Forward / BackwardInput / BackwardWeight with accumulate,
// the same formulas and parameter layout), on device pointers and a stream.
//
// Compute: kFloat32 (fp32 GEMMs), kTf32 (fp32 tensors, TF32 tensor-core
// GEMMs), kBFloat16 (bf16 activations and GEMM inputs, fp32 accumulate).
// Parameters and their gradients are always float32 (master weights); for
// kBFloat16, bf16 copies of fc1/fc2 weights come from the caller
// (CudaMlpBlockParams::*_bf16, e.g. written by FusedAdamW) or are made by
// Forward/BackwardInput into the block's own cache. Activations x, y,
// d_out, dx are float32 (kFloat32/kTf32) or bfloat16 (kBFloat16).
//
// cuBLASLt epilogues (kernels/cuda/gemm_lt.h) replace separate kernels
// where they apply: fc1 forward with bias + gelu_tanh (aux = the
// pre-activation) or bias + relu (aux = cuBLASLt's relu bitmask, which only
// the fused backward reads; an unfused relu backward uses act_out, as
// relu'(x) = [relu(x) > 0]); fc2 forward with bias (the residual stays
// beta = 1, C = x); the d_act GEMM of BackwardInput with dgelu_tanh / drelu
// and fc1's bias gradient; the weight-gradient GEMMs with their bias
// gradient (BGRADB) instead of ColumnSums. Exact-erf gelu and swiglu keep
// the element-wise kernels. When GemmLt has no algorithm for a fused GEMM
// (Unimplemented: alignment, ld_aux not a multiple of 8 / 128, an
// unsupported combination) that GEMM falls back to today's element-wise
// path, decided once per (GEMM, rows) and cached, so the step loop asks
// cuBLASLt at most once per shape and a shape always takes the same path.
// The two paths round differently (both within the tolerances of
// docs/GPU.md) and are each deterministic run to run; see gemm_lt.h for
// what cuBLAS promises about its bias-gradient reductions.
//
// Saved tensors live in DeviceBuffers from the caching allocator; x and
// d_out are NOT copied: the caller keeps them alive and unchanged until
// BackwardWeight. Parameter pointers should stay the same across calls
// (cuBLASLt plans depend on their alignment). Everything is enqueued on
// `stream`; nothing synchronises. Not thread-safe (one GemmLt inside); use
// one block per stream.
#ifndef TRAINYARD_KERNELS_CUDA_CUDA_MLP_BLOCK_H_
#define TRAINYARD_KERNELS_CUDA_CUDA_MLP_BLOCK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/block_config.h"
#include "core/tensor.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/runtime.h"

namespace trainyard {
namespace gpu {

enum class ComputeMode { kFloat32, kTf32, kBFloat16 };

struct CudaMlpBlockParams {  // device pointers, float32, as in MlpBlockParams
  const float* norm_weight = nullptr;     // [in]
  const float* norm_bias = nullptr;       // [in] (LayerNorm only)
  const float* fc1_weight = nullptr;      // [fc1_out, in]
  const float* fc1_bias = nullptr;        // [fc1_out]
  const float* fc2_weight = nullptr;      // [out, ffn]
  const float* fc2_bias = nullptr;        // [out]
  const void* fc1_weight_bf16 = nullptr;  // optional bf16 copies (kBFloat16)
  const void* fc2_weight_bf16 = nullptr;
};

struct CudaMlpBlockGrads {  // device pointers, float32
  float* norm_weight = nullptr;
  float* norm_bias = nullptr;
  float* fc1_weight = nullptr;
  float* fc1_bias = nullptr;
  float* fc2_weight = nullptr;
  float* fc2_bias = nullptr;
};

struct CudaMlpBlockSaved {
  int64_t rows = 0;
  const void* x = nullptr;         // [b, in] caller-owned
  const void* norm_out = nullptr;  // x or norm_out_buf
  DeviceBuffer norm_out_buf;       // [b, in]
  DeviceBuffer mean, rstd;         // [b] float32
  DeviceBuffer fc1_out;            // [b, fc1_out] pre-activation; empty
                                   // when relu_mask holds the relu forward
  DeviceBuffer relu_mask;          // cuBLASLt relu bitmask (fused relu)
  int64_t relu_mask_ld = 0;        // its leading dimension, in bits
  DeviceBuffer act_out;            // [b, ffn]
  const void* d_out = nullptr;     // [b, out] caller-owned
  DeviceBuffer d_fc1_out;          // [b, fc1_out]
  DeviceBuffer d_fc1_bias;         // [fc1_out] float32, when BackwardInput's
                                   // fused epilogue computed it
  DeviceBuffer d_norm_out;         // [b, in]
  bool has_grads = false;
};

// How a block's GEMMs ran so far (for tests and benchmarks).
struct CudaMlpBlockEpilogueStats {
  int64_t fused_gemms = 0;  // GEMMs run with a cuBLASLt epilogue
  // (GEMM, rows) pairs that fell back to the element-wise path; cuBLASLt
  // was asked once for each.
  int64_t fallbacks = 0;
};

class CudaMlpBlock {
 public:
  // Errors: invalid config (as MlpBlock), no device, built without CUDA.
  static absl::StatusOr<std::unique_ptr<CudaMlpBlock>> Create(
      const MlpBlockConfig& config, ComputeMode mode, int device);

  const MlpBlockConfig& config() const { return config_; }
  DType activation_type() const {
    return mode_ == ComputeMode::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
  }

  // Whether GEMMs may use cuBLASLt epilogues (default true). false forces
  // the element-wise path everywhere (tests compare both paths; benchmarks
  // measure the difference). May change between calls: a microbatch in
  // flight finishes correctly either way.
  void set_use_epilogues(bool use) { use_epilogues_ = use; }
  bool use_epilogues() const { return use_epilogues_; }
  const CudaMlpBlockEpilogueStats& epilogue_stats() const { return stats_; }
  // One line per (GEMM, rows) decided so far, e.g. "fc1 forward, 64 rows:
  // gelu_tanh_aux_bias" or "fc1 backward, 9 rows: element-wise (<why>)".
  std::string EpilogueReport() const;

  // y [rows, out] = block(x [rows, in]); fills *saved.
  absl::Status Forward(const CudaMlpBlockParams& params, int64_t rows,
                       const void* x, void* y, CudaMlpBlockSaved* saved,
                       Stream stream);

  // dx [rows, in] from d_out [rows, out] (dx may be null).
  absl::Status BackwardInput(const CudaMlpBlockParams& params,
                             const void* d_out, CudaMlpBlockSaved* saved,
                             void* dx, Stream stream);

  // grads (+)= dL/dparams; releases the saved buffers.
  absl::Status BackwardWeight(CudaMlpBlockSaved* saved, bool accumulate,
                              const CudaMlpBlockGrads& grads, Stream stream);

 private:
  CudaMlpBlock(const MlpBlockConfig& c, ComputeMode m, int device,
               std::unique_ptr<GemmLt> gemm)
      : config_(c), mode_(m), device_(device), gemm_(std::move(gemm)) {}
  // D [m, n] = op(A) op(B) (+ C when beta != 0), row-major, no epilogue.
  GemmArgs Args(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                const void* a, int64_t lda, const void* b, int64_t ldb,
                float beta, const void* c, void* d, int64_t ldd,
                DType d_type) const;
  // Runs `g` (its epilogue must be kNone); k == 0 gives D = beta * C.
  absl::Status RunGemm(const GemmArgs& g, Stream stream);
  // Whether GEMM `site` with `rows` rows may still try its epilogue.
  bool MayFuse(int site, int64_t rows) const;
  // Runs `g` with its epilogue. true: it ran; false: GemmLt returned
  // Unimplemented (nothing was enqueued), recorded for (site, rows), and
  // the caller takes the element-wise path. Other errors are returned.
  absl::StatusOr<bool> RunFused(int site, int64_t rows, const GemmArgs& g,
                                Stream stream);
  // dst [n] = src [n] (accumulate: dst += src), float32, on `stream`.
  absl::Status FoldBiasGrad(const float* src, int64_t n, bool accumulate,
                            float* dst, Stream stream);
  // bf16 weights for kBFloat16 (the caller's, or cast into w*_bf16_).
  absl::Status Bf16Weights(const CudaMlpBlockParams& p, const void** w1,
                           const void** w2, Stream stream);
  absl::StatusOr<DeviceBuffer> Alloc(int64_t elements, DType t);

  // Forward's steps, in order: s->norm_out = norm(s->x) (and the norm's
  // statistics); s->act_out = act(fc1(norm_out)), keeping s->fc1_out or
  // s->relu_mask for the backward (FusedFc1Forward: through cuBLASLt's
  // epilogue, false when it fell back); y = fc2(act_out) (+ bias, + x).
  absl::Status NormForward(const CudaMlpBlockParams& p, CudaMlpBlockSaved* s,
                           Stream stream);
  absl::Status Fc1Forward(const CudaMlpBlockParams& p, const void* w1,
                          CudaMlpBlockSaved* s, Stream stream);
  absl::StatusOr<bool> FusedFc1Forward(const float* b1, const void* w1,
                                       CudaMlpBlockSaved* s, Stream stream);
  absl::Status Fc2Forward(const CudaMlpBlockParams& p, const void* w2,
                          const CudaMlpBlockSaved& s, void* y, Stream stream);

  // BackwardInput's steps: saved->d_fc1_out from d_out through fc2 and the
  // activation (FusedFc1Backward: the d_act GEMM with cuBLASLt's epilogue,
  // false when it fell back); then dx (and saved->d_norm_out) from it.
  absl::Status Fc1Backward(const void* w2, const void* d_out,
                           CudaMlpBlockSaved* saved, Stream stream);
  absl::StatusOr<bool> FusedFc1Backward(const GemmArgs& g,
                                        CudaMlpBlockSaved* saved,
                                        Stream stream);
  absl::Status NormBackwardInput(const CudaMlpBlockParams& p, const void* w1,
                                 CudaMlpBlockSaved* saved, void* dx,
                                 Stream stream);

  // BackwardWeight's steps: fc2's and fc1's weight gradients, true when
  // their bias gradient came along; the norm's parameter gradients.
  absl::StatusOr<bool> Fc2WeightGrad(const CudaMlpBlockSaved& saved,
                                     bool accumulate,
                                     const CudaMlpBlockGrads& g, Stream stream);
  absl::StatusOr<bool> Fc1WeightGrad(const CudaMlpBlockSaved& saved,
                                     bool accumulate,
                                     const CudaMlpBlockGrads& g, Stream stream);
  // Weight-gradient GEMM `g` (site, rows) with the BGRADB epilogue into the
  // scratch, folded into bias_grad [n]; false (nothing enqueued) when it
  // fell back.
  absl::StatusOr<bool> FusedWeightGrad(int site, int64_t rows,
                                       const GemmArgs& g, int64_t n,
                                       bool accumulate, float* bias_grad,
                                       Stream stream);
  absl::Status NormParamGrads(const CudaMlpBlockSaved& saved, bool accumulate,
                              const CudaMlpBlockGrads& g, Stream stream);
  // fp32 mode promises float32 results close to the CPU's: cuBLASLt's
  // GELU epilogues may evaluate tanh approximately, so fp32 keeps gelu_tanh
  // on our element-wise kernels (bias and bias-gradient epilogues stay).
  bool exact_fp32() const { return mode_ == ComputeMode::kFloat32; }

  struct EpilogueDecision {
    bool fused = false;
    std::string what;  // the epilogue's name, or why it fell back
  };

  MlpBlockConfig config_;
  ComputeMode mode_;
  int device_;
  std::unique_ptr<GemmLt> gemm_;
  DeviceBuffer w1_bf16_, w2_bf16_;
  DeviceBuffer bias_grad_scratch_;  // float32, max(out, fc1_out)
  DeviceBuffer norm_workspace_;     // the norm's parameter gradients'

  bool use_epilogues_ = true;
  absl::flat_hash_map<std::pair<int, int64_t>, EpilogueDecision> decisions_;
  CudaMlpBlockEpilogueStats stats_;
};

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_CUDA_MLP_BLOCK_H_
