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
// The teacher (task_plugins/mlp_teacher.h) runs in build_forward_inputs
// (first stage), which passes "teacher_logits" float32 [B, C] and "labels"
// int64 [B] as state, so the last stage needs no features. Metrics per step:
// loss, kl, ce, accuracy. Inference outputs: "outputs" float32 [b, C], the
// student's outputs (the model's output as it is).
//
// The loss is kernels/losses.h's Distillation on the host (ABI v1) and the
// simulated device, kernels/cuda/loss_kernels.h's on a GPU (ABI v2). The
// teacher stays on the host on every device: build_forward_inputs runs
// there and the engine moves its state to the device.
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "kernels/cuda/loss_kernels.h"
#include "kernels/losses.h"
#include "task_plugins/mlp_teacher.h"
#include "task_plugins/plugin_losses.h"
#include "task_plugins/plugin_sdk.h"

namespace trainyard {
namespace plugin {
namespace {

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
  // Top-level activation / norm / residual, or teacher_blocks (per_block).
  TeacherStyles styles;
};

// temperature, alpha, ignore_index, teacher and base_dir into `o`.
absl::Status ParseScalars(const nlohmann::json& config, Options* o) {
  ASSIGN_OR_RETURN(const double t,
                   GetNumber(config, "temperature", o->temperature));
  if (!(t > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.config.temperature: must be > 0, got ", t));
  }
  ASSIGN_OR_RETURN(const double alpha, GetNumber(config, "alpha", o->alpha));
  if (alpha < 0 || alpha > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.config.alpha: must be in [0, 1], got ", alpha));
  }
  ASSIGN_OR_RETURN(const int64_t ignore,
                   GetInt(config, "ignore_index", o->ignore_index));
  ASSIGN_OR_RETURN(std::string teacher, GetString(config, "teacher", ""));
  if (teacher.empty()) {
    return absl::InvalidArgumentError(
        "task.config.teacher: required (path to the teacher's safetensors "
        "file)");
  }
  ASSIGN_OR_RETURN(std::string base_dir, GetString(config, "base_dir", ""));
  o->temperature = t;
  o->alpha = alpha;
  o->ignore_index = ignore;
  o->teacher = std::move(teacher);
  o->base_dir = std::move(base_dir);
  return absl::OkStatus();
}

// The top-level block style, and teacher_blocks when given (not both).
absl::StatusOr<TeacherStyles> ParseStyles(const nlohmann::json& config) {
  TeacherStyles styles;
  ASSIGN_OR_RETURN(styles.common,
                   ParseStyle(config, "task.config.", true, BlockStyle()));
  auto list = config.find("teacher_blocks");
  if (list == config.end()) return styles;
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
  styles.per_block = true;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string where =
        absl::StrCat("task.config.teacher_blocks[", i, "].");
    if (!(*list)[i].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where.substr(0, where.size() - 1),
                       ": must be an object, got ", (*list)[i].dump()));
    }
    ASSIGN_OR_RETURN(BlockStyle style,
                     ParseStyle((*list)[i], where, false, BlockStyle()));
    styles.blocks.push_back(style);
  }
  return styles;
}

absl::StatusOr<Options> ParseOptions(const nlohmann::json& config) {
  Options o;
  RETURN_IF_ERROR(ParseScalars(config, &o));
  ASSIGN_OR_RETURN(o.styles, ParseStyles(config));
  return o;
}

class LogitDistillationTask : public ClassifierTask {
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
    ASSIGN_OR_RETURN(const Options options, ParseOptions(config));
    if (ctx.validate_only) return nullptr;
    ASSIGN_OR_RETURN(
        const std::string path,
        ResolveDataPath(ctx, "teacher", options.teacher, options.base_dir));
    ASSIGN_OR_RETURN(MlpTeacher teacher,
                     MlpTeacher::Load(path, options.styles));
    return std::unique_ptr<PluginTask>(
        new LogitDistillationTask(options, std::move(teacher)));
  }

  absl::Status BuildForwardInputs(const TrainyardBatch& batch,
                                  TrainyardSink* out) override {
    ASSIGN_OR_RETURN(const TrainyardTensor* found,
                     CopyFeaturesToInputs(batch, out));
    const TrainyardTensor& features = *found;
    const int64_t b = features.shape[0];
    const int64_t in = teacher_.in_features();
    if (features.shape[1] != in) {
      return absl::InvalidArgumentError(absl::StrCat(
          "teacher ", teacher_.path(), ": tensor blocks.0.fc1.weight expects ",
          in, " input features, but \"features\" is ", ShapeString(features)));
    }
    ASSIGN_OR_RETURN(const TrainyardTensor* targets,
                     FindClassTargets(batch, "logit_distillation"));
    ASSIGN_OR_RETURN(
        const Tensor logits,
        teacher_.Forward(static_cast<const float*>(features.data), b));
    ASSIGN_OR_RETURN(void* p, AddTensor(out, "teacher_logits",
                                        TRAINYARD_FLOAT32, {b, logits.dim(1)}));
    if (logits.numel() > 0) std::memcpy(p, logits.raw_data(), logits.nbytes());
    return AddLabels(*targets, b, out);
  }

  absl::Status ComputeLoss(const TrainyardLossArgs& args,
                           TrainyardLossResult* result,
                           TrainyardSink* metrics) override {
    const TrainyardTensor& out = *args.output;
    const int64_t b = out.shape[0];
    const int64_t c = out.shape[1];
    ASSIGN_OR_RETURN(const TrainyardTensor* teacher,
                     FindState(args, "teacher_logits"));
    ASSIGN_OR_RETURN(const TrainyardTensor* found, FindState(args, "labels"));
    if (!LogitsMatch(*teacher, b, c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "teacher ", teacher_.path(), ": teacher_logits ",
          ShapeString(*teacher), " (tensor blocks.", teacher_.num_blocks() - 1,
          ".fc2.weight gives ", teacher_.out_features(),
          " classes) do not match the student output ", ShapeString(out)));
    }
    ASSIGN_OR_RETURN(const losses::Labels labels,
                     HostLabels(args, *found, b, ignore_index_));
    double slots[kNumSlots];
    losses::Distillation(HostOutput(args, b, c),
                         static_cast<const float*>(teacher->data), labels,
                         temperature_, alpha_, slots);
    RETURN_IF_ERROR(CheckLabelSlots(slots, args.microbatch,
                                    args.num_microbatches, c, ignore_index_));
    result->loss = MeanLoss(slots);
    result->loss_weight = slots[0];
    Accumulate(args.is_eval, slots);
    return absl::OkStatus();
  }

  size_t DeviceWorkspaceBytes(int64_t rows, int64_t cols) override {
    return gpu::ClassifierWorkspaceBytes(rows, cols);
  }

  absl::Status ComputeLossDevice(const TrainyardDeviceLossArgs& a) override {
    ASSIGN_OR_RETURN(const losses::Output out, CheckDeviceOutput(a));
    ASSIGN_OR_RETURN(const TrainyardTensor* teacher,
                     FindState(a, "teacher_logits"));
    ASSIGN_OR_RETURN(const TrainyardTensor* found, FindState(a, "labels"));
    if (!LogitsMatch(*teacher, out.rows, out.cols)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "teacher ", teacher_.path(), ": teacher_logits ",
          ShapeString(*teacher), " do not match the student output ",
          ShapeString(*a.output)));
    }
    ASSIGN_OR_RETURN(const losses::Labels labels,
                     DeviceLabels(*found, out.rows, ignore_index_));
    classes_ = out.cols;
    const float* z = static_cast<const float*>(teacher->data);
    if (a.device_kind == TRAINYARD_DEVICE_SIM) {
      losses::Distillation(out, z, labels, temperature_, alpha_, a.slots);
      return absl::OkStatus();
    }
    return gpu::DistillationLoss(out, z, labels, temperature_, alpha_,
                                 a.workspace, a.slots,
                                 static_cast<gpu::Stream>(a.stream));
  }

  // Inference: the student's outputs, the model's output as it is.
  absl::Status InferOutputs(const TrainyardInferArgs& args,
                            TrainyardSink* out) override {
    return AddFloat32Copy(out, "outputs", *args.output);
  }

 private:
  LogitDistillationTask(const Options& options, MlpTeacher teacher)
      : ClassifierTask(options.ignore_index, {"loss", "kl", "ce", "accuracy"}),
        temperature_(options.temperature),
        alpha_(options.alpha),
        teacher_(std::move(teacher)) {}

  // Whether `t` is float32 [rows, cols].
  static bool LogitsMatch(const TrainyardTensor& t, int64_t rows,
                          int64_t cols) {
    return t.dtype == TRAINYARD_FLOAT32 && t.ndim == 2 && t.shape[0] == rows &&
           t.shape[1] == cols;
  }
  // The microbatch's mean loss from its slots (0 when every row is ignored).
  double MeanLoss(const double* slots) const {
    const double n = slots[0];
    if (n == 0) return 0;
    const double t = temperature_;
    return alpha_ * t * t * slots[4] / n + (1 - alpha_) * slots[5] / n;
  }
  // Slots [0] rows, [1] their weighted loss, [4] KL, [5] CE, [6] correct.
  void Accumulate(bool is_eval, const double* slots) override {
    if (slots[0] == 0) return;
    metrics_.Add(is_eval, static_cast<int64_t>(slots[0]),
                 {slots[1], slots[4], slots[5], slots[6]});
  }

  const double temperature_;
  const double alpha_;
  const MlpTeacher teacher_;
};

}  // namespace
}  // namespace plugin
}  // namespace trainyard

TRAINYARD_EXPORT_DEVICE_TASK_PLUGIN(trainyard::plugin::LogitDistillationTask,
                                    "logit_distillation")
