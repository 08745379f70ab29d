#include "task_plugins/mlp_teacher.h"

#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/safetensors.h"
#include "core/status_macros.h"

namespace trainyard {
namespace plugin {
namespace {

using TensorMap = std::map<std::string, Tensor>;

// The teacher file's tensors by name.
absl::StatusOr<TensorMap> ReadTensors(const std::string& path) {
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  if (!file.ok()) return Prefixed(file.status(), "task.config.teacher: ");
  TensorMap tensors;
  for (const auto& [name, t] : file->tensors) tensors[name] = t;
  return tensors;
}

// One style per block: styles.blocks when per_block (one for each of the
// num_blocks blocks), else styles.common for every block.
absl::StatusOr<std::vector<BlockStyle>> StylePerBlock(
    const TeacherStyles& styles, int num_blocks, const std::string& who) {
  if (!styles.per_block) {
    return std::vector<BlockStyle>(num_blocks, styles.common);
  }
  if (static_cast<int>(styles.blocks.size()) != num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, "has ", num_blocks, " blocks (blocks.0 .. blocks.", num_blocks - 1,
        ") but task.config.teacher_blocks lists ", styles.blocks.size()));
  }
  return styles.blocks;
}

// Block i's config: its style, and the sizes of its fc1 and fc2 weights
// (prefix p = "blocks.<i>."), which must take what `previous` (the block
// before, null for the first) produces.
absl::StatusOr<MlpBlockConfig> BlockConfig(int i, const BlockStyle& style,
                                           TensorMap& tensors,
                                           const MlpBlockConfig* previous,
                                           const std::string& who) {
  const std::string p = absl::StrCat("blocks.", i, ".");
  MlpBlockConfig cfg;
  absl::StatusOr<Activation> act = ActivationFromName(style.activation);
  if (!act.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block ", i, ": ", act.status().message()));
  }
  absl::StatusOr<NormType> norm = NormTypeFromName(style.norm);
  if (!norm.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block ", i, ": ", norm.status().message()));
  }
  cfg.activation = *act;
  cfg.norm = *norm;
  cfg.residual = style.residual;
  const Tensor& fc1 = tensors[p + "fc1.weight"];
  auto fc2 = tensors.find(p + "fc2.weight");
  if (fc2 == tensors.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, "missing tensor ", p, "fc2.weight"));
  }
  for (const auto& [name, t] :
       {std::pair<std::string, const Tensor*>{p + "fc1.weight", &fc1},
        {p + "fc2.weight", &fc2->second}}) {
    if (t->ndim() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, "tensor ", name, ": must be 2-D, got ",
                       ShapeToString(t->shape())));
    }
  }
  cfg.in_features = fc1.dim(1);
  cfg.out_features = fc2->second.dim(0);
  cfg.ffn_hidden_size = fc2->second.dim(1);
  cfg.bias = tensors.count(p + "fc1.bias") > 0;
  if (previous != nullptr && cfg.in_features != previous->out_features) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, "tensor ", p, "fc1.weight: takes ", cfg.in_features,
        " inputs but block ", i - 1, " produces ", previous->out_features));
  }
  if (cfg.residual && cfg.in_features != cfg.out_features) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, "block ", i, " is residual but maps ",
                     cfg.in_features, " -> ", cfg.out_features, " features"));
  }
  return cfg;
}

// Block i's parameters from `tensors`, each float32 of the shape `cfg`
// implies; their names go to `used`.
absl::StatusOr<MlpBlockParams> BlockParams(int i, const BlockStyle& style,
                                           const MlpBlockConfig& cfg,
                                           const TensorMap& tensors,
                                           const std::string& who,
                                           std::set<std::string>* used) {
  const std::string p = absl::StrCat("blocks.", i, ".");
  MlpBlockParams params;
  std::vector<Tensor*> slots = params.InOrder(cfg);
  std::vector<ParamInfo> infos = BlockParamInfos(cfg);
  for (size_t k = 0; k < infos.size(); ++k) {
    const std::string name = p + infos[k].name;
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, "missing tensor ", name, " (block ", i, ": norm \"",
                       style.norm, "\", activation \"", style.activation,
                       "\", bias ", cfg.bias ? "yes" : "no", ")"));
    }
    if (it->second.dtype() != DType::kFloat32) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, "tensor ", name, ": must be float32, got ",
                       DTypeName(it->second.dtype())));
    }
    if (it->second.shape() != infos[k].shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, "tensor ", name, ": expected shape ",
                       ShapeToString(infos[k].shape), ", got ",
                       ShapeToString(it->second.shape())));
    }
    *slots[k] = it->second;
    used->insert(name);
  }
  return params;
}

}  // namespace

absl::StatusOr<MlpTeacher> MlpTeacher::Load(const std::string& path,
                                            const TeacherStyles& styles) {
  const std::string who = absl::StrCat("teacher ", path, ": ");
  ASSIGN_OR_RETURN(TensorMap tensors, ReadTensors(path));
  int num_blocks = 0;
  while (tensors.count(absl::StrCat("blocks.", num_blocks, ".fc1.weight"))) {
    ++num_blocks;
  }
  if (num_blocks == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, "missing tensor blocks.0.fc1.weight"));
  }
  ASSIGN_OR_RETURN(std::vector<BlockStyle> style,
                   StylePerBlock(styles, num_blocks, who));
  MlpTeacher teacher;
  teacher.path_ = path;
  std::set<std::string> used;
  for (int i = 0; i < num_blocks; ++i) {
    const MlpBlockConfig* previous =
        i > 0 ? &teacher.blocks_.back().block.config() : nullptr;
    ASSIGN_OR_RETURN(MlpBlockConfig cfg,
                     BlockConfig(i, style[i], tensors, previous, who));
    ASSIGN_OR_RETURN(MlpBlockParams params,
                     BlockParams(i, style[i], cfg, tensors, who, &used));
    teacher.blocks_.push_back(Block{MlpBlock(cfg), std::move(params)});
  }
  for (const auto& [name, t] : tensors) {
    if (used.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, "unexpected tensor ", name,
                       " (not used by the configured teacher blocks; check "
                       "teacher_blocks / norm / bias)"));
    }
  }
  return teacher;
}

int64_t MlpTeacher::in_features() const {
  return blocks_.front().block.config().in_features;
}

int64_t MlpTeacher::out_features() const {
  return blocks_.back().block.config().out_features;
}

absl::StatusOr<Tensor> MlpTeacher::Forward(const float* features,
                                           int64_t rows) const {
  const int64_t d = in_features();
  Tensor x = Tensor::Empty(DType::kFloat32, {rows, d});
  if (rows * d > 0)
    std::memcpy(x.raw_data(), features, sizeof(float) * rows * d);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Tensor y;
    MlpBlockSaved saved;
    absl::Status s = blocks_[i].block.Forward(blocks_[i].params, x, &y, &saved);
    if (!s.ok()) {
      return absl::InternalError(absl::StrCat("teacher ", path_, " block ", i,
                                              " forward: ", s.message()));
    }
    x = y;
  }
  return x;
}

}  // namespace plugin
}  // namespace trainyard
