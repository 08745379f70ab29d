// The shape of one MLP block: its configuration, its parameters' names and
// shapes, and the one check of a configuration. A leaf: the planner, the CPU
// kernels and the CUDA kernels all describe blocks with these types.
//
//   y = fc2(act(fc1(norm(x)))) (+ x if residual)
//
// fc1 maps in -> ffn (2*ffn for SwiGLU), fc2 maps ffn -> out. Weights use
// PyTorch's nn.Linear layout [out_features, in_features].
#ifndef TRAINYARD_CORE_BLOCK_CONFIG_H_
#define TRAINYARD_CORE_BLOCK_CONFIG_H_

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

// OK when `config` describes a block: positive sizes, a residual only
// between equal widths, a positive norm epsilon when there is a norm.
absl::Status ValidateBlockConfig(const MlpBlockConfig& config);

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

}  // namespace trainyard

#endif  // TRAINYARD_CORE_BLOCK_CONFIG_H_
