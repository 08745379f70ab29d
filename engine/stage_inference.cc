// Stage: an inference job's pass, and an infer or eval job's model.
#include <set>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/checkpoint_store.h"
#include "engine/stage.h"

namespace trainyard {

absl::Status Stage::RunInference(int64_t begin, int64_t end, int64_t first_tag,
                                 const InferSink& sink,
                                 const std::atomic<bool>* cancel) {
  if (plan_.kind != JobKind::kInfer) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(), ": RunInference in a job of kind ", Quote(plan_.spec.kind())));
  }
  if (begin < 0 || end < begin || end > data_.eval_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": rows [", begin, ", ", end,
                     ") are not inside the job's ", data_.eval_rows, " rows"));
  }
  infer_sink_ = &sink;
  infer_cancel_ = cancel;
  absl::Cleanup done = [this] {
    infer_sink_ = nullptr;
    infer_cancel_ = nullptr;
  };
  return ForwardBatches(begin, end, first_tag);
}

absl::Status Stage::InferMicrobatch(Microbatch* mb) {
  const int64_t row = microbatch_rows_[mb->index];
  const int64_t rows = mb->output.dim(0);
  // The plugin reads float32 host tensors.
  ASSIGN_OR_RETURN(Tensor wide, ctx_->Cast(mb->output, DType::kFloat32));
  ASSIGN_OR_RETURN(Tensor output, ctx_->ToHost(wide));
  NamedTensors state;
  for (auto& [name, t] : mb->state) {
    ASSIGN_OR_RETURN(Tensor host, ctx_->ToHost(t));
    state.push_back({name, std::move(host)});
  }
  mb->output = Tensor();
  mb->state.clear();
  absl::StatusOr<NamedTensors> outputs = task_->InferOutputs(
      output, state, row, plan_.spec.inference().output_dir(), mb->index,
      static_cast<int32_t>(microbatch_rows_.size()));
  if (!outputs.ok()) {
    return Prefixed(
        outputs.status(),
        absl::StrCat(Where(), ": data rows [", row, ", ", row + rows, "): "));
  }
  return (*infer_sink_)(row, *std::move(outputs));
}

absl::Status Stage::LoadModel(const std::string& dir, int64_t step) {
  const std::string where = absl::StrCat("checkpoint ", dir, " step ", step);
  ASSIGN_OR_RETURN(CheckpointManifest manifest,
                   ReadCheckpointManifest(dir, step));
  const int saved_stages = static_cast<int>(manifest.stages.size());
  std::map<std::string, Tensor> tensors;
  for (int k = 0; k < saved_stages; ++k) {
    ASSIGN_OR_RETURN(SafetensorsFile file,
                     ReadStageFile(dir, step, k, saved_stages));
    for (auto& [name, t] : file.tensors) tensors[name] = std::move(t);
  }
  // A block parameter the spec's model lacks: the checkpoint is of another
  // model (more blocks, or another kind of block).
  std::set<std::string> known;
  for (const JobPlan::ParamSpec& p : plan_.params) known.insert(p.name);
  for (const auto& [name, t] : tensors) {
    if (absl::StartsWith(name, "blocks.") && known.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": holds parameter \"", name,
          "\", which the spec's model does not have: the checkpoint is of "
          "another model"));
    }
  }
  RETURN_IF_ERROR(store_->Load(tensors, where));
  completed_steps_ = step;
  return absl::OkStatus();
}

}  // namespace trainyard
