#include "core/block_config.h"

#include "absl/strings/str_cat.h"

namespace trainyard {

absl::StatusOr<Activation> ActivationFromName(const std::string& name) {
  if (name == "relu") return Activation::kRelu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_tanh") return Activation::kGeluTanh;
  if (name == "swiglu") return Activation::kSwiglu;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown activation \"", name,
                   "\" (expected relu, gelu, gelu_tanh or swiglu)"));
}

absl::StatusOr<NormType> NormTypeFromName(const std::string& name) {
  if (name == "none") return NormType::kNone;
  if (name == "layernorm") return NormType::kLayerNorm;
  if (name == "rmsnorm") return NormType::kRmsNorm;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown norm \"", name, "\" (expected none, layernorm or rmsnorm)"));
}

absl::Status ValidateBlockConfig(const MlpBlockConfig& c) {
  if (c.in_features <= 0 || c.out_features <= 0 || c.ffn_hidden_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlpBlockConfig: in_features, out_features and ffn_hidden_size must "
        "be > 0, got ",
        c.in_features, ", ", c.out_features, ", ", c.ffn_hidden_size));
  }
  if (c.residual && c.in_features != c.out_features) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlpBlockConfig: residual needs in_features == out_features, got ",
        c.in_features, " and ", c.out_features));
  }
  if (c.norm != NormType::kNone && !(c.norm_eps > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlpBlockConfig: norm_eps must be > 0, got ", c.norm_eps));
  }
  return absl::OkStatus();
}

std::vector<ParamInfo> BlockParamInfos(const MlpBlockConfig& c) {
  std::vector<ParamInfo> infos;
  if (c.norm != NormType::kNone) {
    infos.push_back({"norm.weight", {c.in_features}, true});
  }
  if (c.norm == NormType::kLayerNorm) {
    infos.push_back({"norm.bias", {c.in_features}, true});
  }
  infos.push_back({"fc1.weight", {c.fc1_out(), c.in_features}, false});
  if (c.bias) infos.push_back({"fc1.bias", {c.fc1_out()}, true});
  infos.push_back({"fc2.weight", {c.out_features, c.ffn_hidden_size}, false});
  if (c.bias) infos.push_back({"fc2.bias", {c.out_features}, true});
  return infos;
}

}  // namespace trainyard
