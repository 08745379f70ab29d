// Stage: checkpoint state. A stage's file of a checkpoint (parameters,
// optimizer state, task state, metadata; docs/CHECKPOINT_FORMAT.md), and
// the restore of that state from checkpoint files or an in-memory snapshot.
#include <cstring>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "engine/checkpoint_store.h"
#include "engine/stage.h"

namespace trainyard {
namespace {

const char* TaskStateKey(bool first_only) {
  return first_only ? "task.first_stage.state" : "task.last_stage.state";
}

}  // namespace

absl::StatusOr<SafetensorsFile> Stage::CheckpointContents(bool stable) const {
  RETURN_IF_ERROR(CheckTrains("a checkpoint"));
  SafetensorsFile file;
  // Copies when `stable`: the step loop goes on changing the live buffers
  // while the file is written.
  auto host = [&](const Tensor& t) {
    return stable ? ctx_->HostCopy(t) : ctx_->ToHost(t);
  };
  ASSIGN_OR_RETURN(Tensor params, host(store_->params()));
  file.tensors = store_->Slice(params);
  for (auto& [name, t] : optimizer_->StateTensors()) {
    ASSIGN_OR_RETURN(Tensor host, host(t));
    file.tensors.push_back({name, host});
  }
  if (task_ != nullptr) {
    ASSIGN_OR_RETURN(std::string state, task_->StateDict());
    ASSIGN_OR_RETURN(
        Tensor bytes,
        Tensor::Create(DType::kUInt8, {static_cast<int64_t>(state.size())}));
    if (!state.empty()) {
      std::memcpy(bytes.raw_data(), state.data(), state.size());
    }
    file.tensors.push_back({TaskStateKey(is_first() && !is_last()), bytes});
  }
  file.metadata["format"] = "trainyard-checkpoint-v1";
  file.metadata["step"] = absl::StrCat(completed_steps_);
  file.metadata["optimizer_step"] = absl::StrCat(optimizer_->step_count());
  file.metadata["stage"] = absl::StrCat(index_);
  if (is_first()) {
    file.metadata["data_position"] = absl::StrCat(sampler_->position());
  }
  return file;
}

absl::StatusOr<std::string> Stage::WriteCheckpointFile(const std::string& dir) {
  ASSIGN_OR_RETURN(SafetensorsFile file, CheckpointContents());
  return WriteStageFile(dir, completed_steps_, index_, file);
}

absl::Status Stage::RestoreCheckpoint(const std::string& dir, int64_t step) {
  // Read every stage file: parameters are found by name wherever they are.
  ASSIGN_OR_RETURN(CheckpointManifest manifest,
                   ReadCheckpointManifest(dir, step));
  const int saved_stages = static_cast<int>(manifest.stages.size());
  std::vector<SafetensorsFile> files;
  for (int k = 0; k < saved_stages; ++k) {
    ASSIGN_OR_RETURN(SafetensorsFile file,
                     ReadStageFile(dir, step, k, saved_stages));
    files.push_back(std::move(file));
  }
  return RestoreState(std::move(files), step,
                      absl::StrCat("checkpoint ", dir, " step ", step));
}

absl::Status Stage::RestoreSnapshot(absl::string_view bytes, int64_t step) {
  const std::string where =
      absl::StrCat("snapshot of stage ", index_, " after step ", step);
  // Every failure is DataLoss (a snapshot damaged or mixed up on its way),
  // which the controller restarts from checkpoints instead.
  absl::StatusOr<SafetensorsFile> file = ParseSafetensors(bytes, where);
  if (!file.ok()) return absl::DataLossError(file.status().message());
  if (file->metadata["stage"] != absl::StrCat(index_) ||
      file->metadata["step"] != absl::StrCat(step)) {
    return absl::DataLossError(
        absl::StrCat(where, ": holds stage ", file->metadata["stage"],
                     " after step ", file->metadata["step"]));
  }
  std::vector<SafetensorsFile> files;
  files.push_back(*std::move(file));
  absl::Status st = RestoreState(std::move(files), step, where);
  if (!st.ok()) return absl::DataLossError(st.message());
  return absl::OkStatus();
}

absl::Status Stage::RestoreState(std::vector<SafetensorsFile> files,
                                 int64_t step, const std::string& where) {
  RETURN_IF_ERROR(CheckTrains("a restore"));
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  for (SafetensorsFile& file : files) {
    for (auto& [name, t] : file.tensors) tensors[name] = t;
    for (auto& [key, value] : file.metadata) {
      if (key == "data_position" || key == "optimizer_step") {
        metadata[key] = value;
      }
    }
  }
  RETURN_IF_ERROR(store_->Load(tensors, where));
  int64_t opt_step = 0;
  if (!absl::SimpleAtoi(metadata["optimizer_step"], &opt_step)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": metadata optimizer_step is missing or bad"));
  }
  {
    absl::Status st = optimizer_->LoadState(tensors, opt_step);
    if (!st.ok()) return Prefixed(st, absl::StrCat(where, ": "));
  }
  if (is_first()) {
    int64_t position = 0;
    if (!absl::SimpleAtoi(metadata["data_position"], &position) ||
        position < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": metadata data_position is missing or bad: \"",
                       metadata["data_position"], "\""));
    }
    sampler_->Seek(position);
  }
  if (task_ != nullptr) {
    auto it = tensors.find(TaskStateKey(is_first() && !is_last()));
    if (it != tensors.end()) {
      const Tensor& t = it->second;
      std::string bytes(static_cast<const char*>(t.raw_data()), t.nbytes());
      RETURN_IF_ERROR(task_->LoadStateDict(bytes));
    }
  }
  completed_steps_ = step;
  return absl::OkStatus();
}

}  // namespace trainyard
