// MlpBlock: one block of the Trainyard MLP, after Megatron Core's MLP.
//
//   y = fc2(act(fc1(norm(x)))) (+ x if residual)
//
// fc1 maps in -> ffn (2*ffn for SwiGLU, whose first half goes through SiLU
// and multiplies the second half), fc2 maps ffn -> out. Weights use
// PyTorch's nn.Linear layout [out_features, in_features].
//
// Backward is split like Megatron's backward_dw(): BackwardInput computes the
// input gradient and stashes what the weight gradient needs;
// BackwardWeight later accumulates the weight gradients. Pipeline schedules
// may run the two at different times (zero-bubble), in any order across
// microbatches as long as each microbatch's BackwardWeight follows its own
// BackwardInput.
//
// An MlpBlock holds no parameters; it reads the caller's tensors, so one
// stage can keep all its parameters in one flat buffer. Not thread-safe per
// call site; distinct blocks may run on distinct threads.
#ifndef TRAINYARD_KERNELS_MLP_BLOCK_H_
#define TRAINYARD_KERNELS_MLP_BLOCK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace trainyard {

enum class Activation { kRelu, kGelu, kGeluTanh, kSwiglu };
enum class NormType { kNone, kLayerNorm, kRmsNorm };

absl::StatusOr<Activation> ActivationFromName(const std::string& name);
absl::StatusOr<NormType> NormTypeFromName(const std::string& name);

struct MlpBlockConfig {
  int64_t in_features = 0;
  int64_t out_features = 0;
  int64_t ffn_hidden_size = 0;
  Activation activation = Activation::kGelu;
  bool bias = true;
  NormType norm = NormType::kNone;
  bool residual = false;  // requires in_features == out_features
  float norm_eps = 1e-5f;

  // Rows of fc1's weight: ffn, or 2*ffn for SwiGLU.
  int64_t fc1_out() const {
    return activation == Activation::kSwiglu ? 2 * ffn_hidden_size
                                             : ffn_hidden_size;
  }
};

// One parameter tensor of a block, in checkpoint order.
struct ParamInfo {
  std::string name;  // "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                     // "norm.weight", "norm.bias"
  Shape shape;
  bool is_bias_or_norm;  // excluded from weight decay by default
};

// The parameters a block with `config` has, in a fixed order:
// norm.weight, norm.bias (LayerNorm only), fc1.weight, fc1.bias, fc2.weight,
// fc2.bias; biases only when config.bias.
std::vector<ParamInfo> BlockParamInfos(const MlpBlockConfig& config);

// Parameters (or their gradients), in BlockParamInfos order; tensors that
// the config does not use stay undefined.
struct MlpBlockParams {
  Tensor norm_weight;  // [in]
  Tensor norm_bias;    // [in] (LayerNorm only)
  Tensor fc1_weight;   // [fc1_out, in]
  Tensor fc1_bias;     // [fc1_out]
  Tensor fc2_weight;   // [out, ffn]
  Tensor fc2_bias;     // [out]
  // Optional, GPU only: bfloat16 copies of fc1_weight and fc2_weight (the
  // float32 weights rounded), written by the optimizer with each update.
  // bf16 blocks read them instead of casting the weights on every call.
  // Not parameters: InOrder does not list them.
  Tensor fc1_weight_bf16;  // [fc1_out, in]
  Tensor fc2_weight_bf16;  // [out, ffn]

  // Pointers to the tensors above in BlockParamInfos order.
  std::vector<Tensor*> InOrder(const MlpBlockConfig& config);
};

// What Forward saves for the backward passes of one microbatch.
struct MlpBlockSaved {
  Tensor x;         // [b, in]  block input
  Tensor norm_out;  // [b, in]  (alias of x when norm is none)
  Tensor mean;      // [b]      LayerNorm only
  Tensor rstd;      // [b]      LayerNorm/RMSNorm
  Tensor fc1_out;   // [b, fc1_out] pre-activation
  Tensor act_out;   // [b, ffn]
  // Filled by BackwardInput for BackwardWeight:
  Tensor d_out;       // [b, out]  gradient of the block output
  Tensor d_fc1_out;   // [b, fc1_out]
  Tensor d_norm_out;  // [b, in]   (norm weight/bias gradients)
};

class MlpBlock {
 public:
  explicit MlpBlock(const MlpBlockConfig& config) : config_(config) {}
  const MlpBlockConfig& config() const { return config_; }

  // y [b, out] = block(x [b, in]). Allocates y and the saved tensors.
  absl::Status Forward(const MlpBlockParams& params, const Tensor& x, Tensor* y,
                       MlpBlockSaved* saved) const;

  // dx [b, in] from d_out [b, out]; stores into *saved what BackwardWeight
  // needs. `dx` may be null for the first block of the model.
  absl::Status BackwardInput(const MlpBlockParams& params, const Tensor& d_out,
                             MlpBlockSaved* saved, Tensor* dx) const;

  // grads += dL/dparams for the microbatch in `saved`. With accumulate =
  // false the gradients are overwritten instead (first microbatch of a step;
  // saves zeroing the buffers). Releases the saved tensors.
  absl::Status BackwardWeight(MlpBlockSaved* saved, bool accumulate,
                              MlpBlockParams* grads) const;

 private:
  MlpBlockConfig config_;
};

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_MLP_BLOCK_H_
