// Task plugin "logit_distillation": knowledge distillation from a frozen
// MLP teacher read from a safetensors file (Hinton et al.), with hard labels.
//
//   loss = alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T))
//        + (1 - alpha) * CrossEntropy(student, labels)
//
// KL is torch.nn.KLDivLoss(reduction="batchmean") of log_softmax(student/T)
// against softmax(teacher/T) over the non-ignored samples; CrossEntropy is
// the mean over the same samples. loss_weight = their count.
//
// Config:
//   "teacher":  path to a safetensors file with blocks.{i}.fc1.weight
//               [fc1_out, in], blocks.{i}.fc2.weight [out, ffn], optional
//               .fc1.bias/.fc2.bias and .norm.weight/.norm.bias; a relative
//               path is resolved against "base_dir" when given, else against
//               the host's data folder. With a data folder (create_confined)
//               the resolved path, symlinks included, must stay inside it
//               (ResolveDataPath).
//   "teacher_blocks": [{"activation", "norm", "residual"}, ...] one per
//               block, or top-level "activation" / "norm" / "residual" for
//               every block (defaults gelu / none / false).
//   "temperature" (2.0, > 0), "alpha" (0.5, in [0, 1]), "ignore_index"
//   (-100).
//
// The teacher runs in build_forward_inputs (first stage), which passes
// "teacher_logits" float32 [B, C] and "labels" int64 [B] as state, so the
// last stage needs no features. Metrics per step: loss, kl, ce, accuracy.
//
// The loss is kernels/losses.h's Distillation on the host (ABI v1) and the
// simulated device, kernels/cuda/loss_kernels.h's on a GPU (ABI v2). The
// teacher stays on the host on every device: build_forward_inputs runs
// there and the engine moves its state to the device.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "kernels/cuda/loss_kernels.h"
#include "kernels/losses.h"
#include "kernels/mlp_block.h"
#include "task_plugins/plugin_sdk.h"

namespace trainyard {
namespace plugin {
namespace {

struct TeacherBlock {
  MlpBlock block;
  MlpBlockParams params;
};

struct BlockStyle {
  std::string activation = "gelu";
  std::string norm = "none";
  bool residual = false;
};

// Reads activation / norm / residual from `j` over `style`. `where` names
// the object ("task.config." or "task.config.teacher_blocks[i]."); only a
// teacher_blocks entry refuses other keys (the top level has its own).
absl::StatusOr<BlockStyle> ParseStyle(const nlohmann::json& j,
                                      const std::string& where,
                                      bool other_keys_allowed,
                                      BlockStyle style) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "activation" || key == "norm") {
      if (!it->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, key, ": must be a string, got ", it->dump()));
      }
      const std::string name = it->get<std::string>();
      const absl::Status known = key == "activation"
                                     ? ActivationFromName(name).status()
                                     : NormTypeFromName(name).status();
      if (!known.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, key, ": ", known.message()));
      }
      (key == "activation" ? style.activation : style.norm) = name;
    } else if (key == "residual") {
      if (!it->is_boolean()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, key, ": must be a boolean, got ", it->dump()));
      }
      style.residual = it->get<bool>();
    } else if (!other_keys_allowed) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, key, ": unknown key (allowed: activation, norm, residual)"));
    }
  }
  return style;
}

// The config, checked for keys, types and ranges; nothing is opened.
struct Options {
  double temperature = 2.0;
  double alpha = 0.5;
  int64_t ignore_index = -100;
  std::string teacher;   // as written
  std::string base_dir;  // as written; "" when absent
  BlockStyle common;     // top-level activation / norm / residual
  // From teacher_blocks, one per block; empty: `common` for every block.
  std::vector<BlockStyle> blocks;
  bool has_teacher_blocks = false;
};

absl::StatusOr<Options> ParseOptions(const nlohmann::json& config) {
  Options o;
  absl::StatusOr<double> t = GetNumber(config, "temperature", o.temperature);
  if (!t.ok()) return t.status();
  if (!(*t > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.config.temperature: must be > 0, got ", *t));
  }
  absl::StatusOr<double> alpha = GetNumber(config, "alpha", o.alpha);
  if (!alpha.ok()) return alpha.status();
  if (*alpha < 0 || *alpha > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.config.alpha: must be in [0, 1], got ", *alpha));
  }
  absl::StatusOr<int64_t> ignore =
      GetInt(config, "ignore_index", o.ignore_index);
  if (!ignore.ok()) return ignore.status();
  absl::StatusOr<std::string> teacher = GetString(config, "teacher", "");
  if (!teacher.ok()) return teacher.status();
  if (teacher->empty()) {
    return absl::InvalidArgumentError(
        "task.config.teacher: required (path to the teacher's safetensors "
        "file)");
  }
  absl::StatusOr<std::string> base_dir = GetString(config, "base_dir", "");
  if (!base_dir.ok()) return base_dir.status();
  o.temperature = *t;
  o.alpha = *alpha;
  o.ignore_index = *ignore;
  o.teacher = *teacher;
  o.base_dir = *base_dir;

  absl::StatusOr<BlockStyle> common =
      ParseStyle(config, "task.config.", true, BlockStyle());
  if (!common.ok()) return common.status();
  o.common = *common;
  auto list = config.find("teacher_blocks");
  if (list != config.end()) {
    if (config.contains("activation") || config.contains("norm") ||
        config.contains("residual")) {
      return absl::InvalidArgumentError(
          "task.config: give either teacher_blocks or a top-level "
          "activation/norm/residual, not both");
    }
    if (!list->is_array()) {
      return absl::InvalidArgumentError(
          "task.config.teacher_blocks: must be a list of objects");
    }
    o.has_teacher_blocks = true;
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string where =
          absl::StrCat("task.config.teacher_blocks[", i, "].");
      if (!(*list)[i].is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where.substr(0, where.size() - 1),
                         ": must be an object, got ", (*list)[i].dump()));
      }
      absl::StatusOr<BlockStyle> st =
          ParseStyle((*list)[i], where, false, BlockStyle());
      if (!st.ok()) return st.status();
      o.blocks.push_back(*st);
    }
  }
  return o;
}

class LogitDistillationTask : public DevicePluginTask {
 public:
  static constexpr uint32_t kNumSlots = losses::kDistillationSlots;
  static constexpr uint32_t kV2Flags = 0;
  static std::set<std::string> ConfigKeys() {
    return {"teacher",  "base_dir",    "teacher_blocks", "activation",  "norm",
            "residual", "temperature", "alpha",          "ignore_index"};
  }

  // Checks the config, then (unless ctx.validate_only) resolves the teacher
  // path inside ctx.data_dir and reads the teacher.
  static absl::StatusOr<std::unique_ptr<PluginTask>> Create(
      const nlohmann::json& config, const CreateContext& ctx) {
    absl::StatusOr<Options> options = ParseOptions(config);
    if (!options.ok()) return options.status();
    if (ctx.validate_only) return nullptr;
    absl::StatusOr<std::string> path =
        ResolveDataPath(ctx, "teacher", options->teacher, options->base_dir);
    if (!path.ok()) return path.status();
    std::unique_ptr<LogitDistillationTask> task(new LogitDistillationTask());
    task->temperature_ = options->temperature;
    task->alpha_ = options->alpha;
    task->ignore_index_ = options->ignore_index;
    task->teacher_path_ = *path;
    absl::Status s = task->LoadTeacher(*options);
    if (!s.ok()) return s;
    return std::unique_ptr<PluginTask>(std::move(task));
  }

  absl::Status BuildForwardInputs(const TrainyardBatch& batch,
                                  TrainyardSink* out) override {
    absl::StatusOr<const TrainyardTensor*> found =
        CopyFeaturesToInputs(batch, out);
    if (!found.ok()) return found.status();
    const TrainyardTensor& features = **found;
    const int64_t b = features.shape[0];
    const int64_t d = features.shape[1];
    const int64_t in = teacher_[0].block.config().in_features;
    if (d != in) {
      return absl::InvalidArgumentError(absl::StrCat(
          "teacher ", teacher_path_, ": tensor blocks.0.fc1.weight expects ",
          in, " input features, but \"features\" is ", ShapeString(features)));
    }
    absl::StatusOr<const TrainyardTensor*> targets =
        FindTensor(batch.tensors, batch.num_tensors, "targets");
    if (!targets.ok()) return targets.status();
    if (!IsLabelTensor(**targets)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_distillation needs class-index \"targets\" int32/int64 [B], "
          "got ",
          DTypeString((*targets)->dtype), " ", ShapeString(**targets)));
    }

    // The frozen teacher's forward pass.
    Tensor x = Tensor::Empty(DType::kFloat32, {b, d});
    if (b * d > 0)
      std::memcpy(x.raw_data(), features.data, sizeof(float) * b * d);
    for (size_t i = 0; i < teacher_.size(); ++i) {
      Tensor y;
      MlpBlockSaved saved;
      absl::Status s =
          teacher_[i].block.Forward(teacher_[i].params, x, &y, &saved);
      if (!s.ok()) {
        return absl::InternalError(absl::StrCat("teacher ", teacher_path_,
                                                " block ", i,
                                                " forward: ", s.message()));
      }
      x = y;
    }
    absl::StatusOr<void*> logits =
        AddTensor(out, "teacher_logits", TRAINYARD_FLOAT32, {b, x.dim(1)});
    if (!logits.ok()) return logits.status();
    if (x.numel() > 0) std::memcpy(*logits, x.raw_data(), x.nbytes());
    absl::StatusOr<void*> labels =
        AddTensor(out, "labels", TRAINYARD_INT64, {b});
    if (!labels.ok()) return labels.status();
    for (int64_t i = 0; i < b; ++i) {
      static_cast<int64_t*>(*labels)[i] = LabelAt(**targets, i);
    }
    return absl::OkStatus();
  }

  absl::Status ComputeLoss(const TrainyardLossArgs& args,
                           TrainyardLossResult* result,
                           TrainyardSink* metrics) override {
    const TrainyardTensor& out = *args.output;
    const int64_t b = out.shape[0];
    const int64_t c = out.shape[1];
    absl::StatusOr<const TrainyardTensor*> tl =
        FindTensor(args.state, args.num_state, "teacher_logits");
    if (!tl.ok()) return tl.status();
    absl::StatusOr<const TrainyardTensor*> lb =
        FindTensor(args.state, args.num_state, "labels");
    if (!lb.ok()) return lb.status();
    const TrainyardTensor& teacher = **tl;
    const TrainyardTensor& labels = **lb;
    if (teacher.dtype != TRAINYARD_FLOAT32 || teacher.ndim != 2 ||
        teacher.shape[0] != b || teacher.shape[1] != c) {
      return absl::InvalidArgumentError(absl::StrCat(
          "teacher ", teacher_path_, ": teacher_logits ", ShapeString(teacher),
          " (tensor blocks.", teacher_.size() - 1, ".fc2.weight gives ",
          teacher_.back().block.config().out_features,
          " classes) do not match the student output ", ShapeString(out)));
    }
    if (!IsLabelTensor(labels) || labels.shape[0] != b) {
      return absl::InvalidArgumentError(absl::StrCat(
          "microbatch ", args.microbatch, ": \"labels\" must be int [", b,
          "], got ", DTypeString(labels.dtype), " ", ShapeString(labels)));
    }
    double slots[kNumSlots];
    losses::Distillation(
        {DType::kFloat32, b, c, out.data,
         args.is_eval ? nullptr : args.grad_output->data, false},
        static_cast<const float*>(teacher.data),
        {labels.dtype == TRAINYARD_INT32 ? DType::kInt32 : DType::kInt64,
         labels.data, ignore_index_},
        temperature_, alpha_, slots);
    if (slots[2] != 0) {
      return BadLabel(slots, args.microbatch, args.num_microbatches, c);
    }
    result->loss = MeanLoss(slots);
    result->loss_weight = slots[0];
    Accumulate(args.is_eval, slots);
    return absl::OkStatus();
  }

  size_t DeviceWorkspaceBytes(int64_t rows, int64_t cols) override {
    return gpu::ClassifierWorkspaceBytes(rows, cols);
  }

  absl::Status ComputeLossDevice(const TrainyardDeviceLossArgs& a) override {
    absl::StatusOr<DeviceOutput> out = CheckDeviceOutput(a);
    if (!out.ok()) return out.status();
    absl::StatusOr<const TrainyardTensor*> tl =
        FindTensor(a.state, a.num_state, "teacher_logits");
    if (!tl.ok()) return tl.status();
    absl::StatusOr<const TrainyardTensor*> lb =
        FindTensor(a.state, a.num_state, "labels");
    if (!lb.ok()) return lb.status();
    const TrainyardTensor& teacher = **tl;
    if (teacher.dtype != TRAINYARD_FLOAT32 || teacher.ndim != 2 ||
        teacher.shape[0] != out->rows || teacher.shape[1] != out->cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          "teacher ", teacher_path_, ": teacher_logits ", ShapeString(teacher),
          " do not match the student output ", ShapeString(*a.output)));
    }
    absl::StatusOr<DType> label_dtype = LabelDType(**lb, out->rows);
    if (!label_dtype.ok()) return label_dtype.status();
    classes_ = out->cols;
    const float* z = static_cast<const float*>(teacher.data);
    if (a.device_kind == TRAINYARD_DEVICE_SIM) {
      losses::Distillation(
          {out->dtype, out->rows, out->cols, out->data, out->grad, true}, z,
          {*label_dtype, (*lb)->data, ignore_index_}, temperature_, alpha_,
          a.slots);
      return absl::OkStatus();
    }
    return gpu::DistillationLoss(
        {out->dtype, out->rows, out->cols, out->data, out->grad}, z,
        *label_dtype, (*lb)->data, ignore_index_, temperature_, alpha_,
        a.workspace, a.slots, static_cast<gpu::Stream>(a.stream));
  }

  absl::Status FinishLoss(const double* slots, int32_t microbatch,
                          int32_t num_microbatches, bool is_eval,
                          TrainyardSink*) override {
    if (slots[2] != 0) {
      return BadLabel(slots, microbatch, num_microbatches, classes_);
    }
    Accumulate(is_eval, slots);
    return absl::OkStatus();
  }

  absl::Status UpdateMetrics(bool is_eval, TrainyardSink* out) override {
    Accum& a = accum_[is_eval ? 1 : 0];
    if (a.count > 0) {
      const double n = static_cast<double>(a.count);
      out->add_metric(out->ctx, "loss", a.loss_sum / n);
      out->add_metric(out->ctx, "kl", a.kl_sum / n);
      out->add_metric(out->ctx, "ce", a.ce_sum / n);
      out->add_metric(out->ctx, "accuracy", a.correct / n);
    }
    a = Accum();
    return absl::OkStatus();
  }

 private:
  LogitDistillationTask() = default;

  // Reads the teacher file and checks it against the block styles.
  absl::Status LoadTeacher(const Options& options) {
    const std::string who = absl::StrCat("teacher ", teacher_path_, ": ");
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors(teacher_path_);
    if (!file.ok()) {
      return absl::Status(
          file.status().code(),
          absl::StrCat("task.config.teacher: ", file.status().message()));
    }
    std::map<std::string, Tensor> tensors;
    for (const auto& [name, t] : file->tensors) tensors[name] = t;
    int num_blocks = 0;
    while (tensors.count(absl::StrCat("blocks.", num_blocks, ".fc1.weight"))) {
      ++num_blocks;
    }
    if (num_blocks == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, "missing tensor blocks.0.fc1.weight"));
    }

    // One style per block.
    std::vector<BlockStyle> styles(num_blocks, options.common);
    if (options.has_teacher_blocks) {
      if (static_cast<int>(options.blocks.size()) != num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, "has ", num_blocks, " blocks (blocks.0 .. blocks.",
            num_blocks - 1, ") but task.config.teacher_blocks lists ",
            options.blocks.size()));
      }
      styles = options.blocks;
    }

    std::set<std::string> used;
    for (int i = 0; i < num_blocks; ++i) {
      const std::string p = absl::StrCat("blocks.", i, ".");
      MlpBlockConfig cfg;
      absl::StatusOr<Activation> act = ActivationFromName(styles[i].activation);
      if (!act.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("block ", i, ": ", act.status().message()));
      }
      absl::StatusOr<NormType> norm = NormTypeFromName(styles[i].norm);
      if (!norm.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("block ", i, ": ", norm.status().message()));
      }
      cfg.activation = *act;
      cfg.norm = *norm;
      cfg.residual = styles[i].residual;
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
      if (i > 0 &&
          cfg.in_features != teacher_.back().block.config().out_features) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, "tensor ", p, "fc1.weight: takes ", cfg.in_features,
            " inputs but block ", i - 1, " produces ",
            teacher_.back().block.config().out_features));
      }
      if (cfg.residual && cfg.in_features != cfg.out_features) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, "block ", i, " is residual but maps ", cfg.in_features, " -> ",
            cfg.out_features, " features"));
      }
      TeacherBlock tb{MlpBlock(cfg), MlpBlockParams()};
      std::vector<Tensor*> slots = tb.params.InOrder(cfg);
      std::vector<ParamInfo> infos = BlockParamInfos(cfg);
      for (size_t k = 0; k < infos.size(); ++k) {
        const std::string name = p + infos[k].name;
        auto it = tensors.find(name);
        if (it == tensors.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              who, "missing tensor ", name, " (block ", i, ": norm \"",
              styles[i].norm, "\", activation \"", styles[i].activation,
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
        used.insert(name);
      }
      teacher_.push_back(std::move(tb));
    }
    for (const auto& [name, t] : tensors) {
      if (used.count(name) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, "unexpected tensor ", name,
                         " (not used by the configured teacher blocks; check "
                         "teacher_blocks / norm / bias)"));
      }
    }
    return absl::OkStatus();
  }

  struct Accum {
    double loss_sum = 0, kl_sum = 0, ce_sum = 0;
    int64_t correct = 0, count = 0;
  };
  // The microbatch's mean loss from its slots (0 when every row is ignored).
  double MeanLoss(const double* slots) const {
    const double n = slots[0];
    if (n == 0) return 0;
    const double t = temperature_;
    return alpha_ * t * t * slots[4] / n + (1 - alpha_) * slots[5] / n;
  }
  void Accumulate(bool is_eval, const double* slots) {
    if (slots[0] == 0) return;
    Accum& a = accum_[is_eval ? 1 : 0];
    a.loss_sum += slots[1];
    a.kl_sum += slots[4];
    a.ce_sum += slots[5];
    a.correct += static_cast<int64_t>(slots[6]);
    a.count += static_cast<int64_t>(slots[0]);
  }
  absl::Status BadLabel(const double* slots, int32_t microbatch,
                        int32_t num_microbatches, int64_t classes) const {
    return absl::InvalidArgumentError(BadLabelMessage(
        microbatch, num_microbatches, static_cast<int64_t>(slots[2]) - 1,
        static_cast<int64_t>(slots[3]), classes, ignore_index_));
  }
  int64_t classes_ = 0;  // of the last device microbatch, for its message
  double temperature_ = 2.0;
  double alpha_ = 0.5;
  int64_t ignore_index_ = -100;
  std::string teacher_path_;
  std::vector<TeacherBlock> teacher_;
  Accum accum_[2];  // [train, eval]
};

}  // namespace
}  // namespace plugin
}  // namespace trainyard

TRAINYARD_EXPORT_DEVICE_TASK_PLUGIN(trainyard::plugin::LogitDistillationTask,
                                    "logit_distillation")
