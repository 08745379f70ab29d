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
// Saved tensors live in DeviceBuffers from the caching allocator; x and
// d_out are NOT copied: the caller keeps them alive and unchanged until
// BackwardWeight. Everything is enqueued on `stream`; nothing synchronises.
// Not thread-safe (one GemmLt inside); use one block per stream.
#ifndef TRAINYARD_KERNELS_CUDA_CUDA_MLP_BLOCK_H_
#define TRAINYARD_KERNELS_CUDA_CUDA_MLP_BLOCK_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/mlp_block.h"

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
  DeviceBuffer fc1_out;            // [b, fc1_out] pre-activation
  DeviceBuffer act_out;            // [b, ffn]
  const void* d_out = nullptr;     // [b, out] caller-owned
  DeviceBuffer d_fc1_out;          // [b, fc1_out]
  DeviceBuffer d_norm_out;         // [b, in]
  bool has_grads = false;
};

class CudaMlpBlock {
 public:
  // Errors: invalid config (as MlpBlock), no device, built without CUDA.
  static absl::StatusOr<std::unique_ptr<CudaMlpBlock>> Create(
      const MlpBlockConfig& config, ComputeMode mode, int device);

  const MlpBlockConfig& config() const { return config_; }
  DataType activation_type() const {
    return mode_ == ComputeMode::kBFloat16 ? DataType::kBFloat16
                                           : DataType::kFloat32;
  }

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
  absl::Status Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                    const void* a, int64_t lda, const void* b, int64_t ldb,
                    float beta, const void* c, void* d, int64_t ldd,
                    DataType d_type, Stream stream);
  // bf16 weights for kBFloat16 (the caller's, or cast into w*_bf16_).
  absl::Status Bf16Weights(const CudaMlpBlockParams& p, const void** w1,
                           const void** w2, Stream stream);
  absl::StatusOr<DeviceBuffer> Alloc(int64_t elements, DataType t);

  MlpBlockConfig config_;
  ComputeMode mode_;
  int device_;
  std::unique_ptr<GemmLt> gemm_;
  DeviceBuffer w1_bf16_, w2_bf16_;
};

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_CUDA_MLP_BLOCK_H_
