#include "engine/forward_job.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/file_util.h"
#include "core/sha256.h"
#include "core/status_macros.h"
#include "engine/checkpoint_store.h"
#include "engine/dataset.h"
#include "engine/stage_runner.h"
#include "nlohmann/json.hpp"

namespace trainyard {
namespace {

using trainyard::v1::JobSpec;

// The model's source and its digest, as a JSON object.
absl::StatusOr<std::string> ModelJson(const JobPlan& plan) {
  const auto& inf = plan.spec.inference();
  nlohmann::ordered_json model = nlohmann::ordered_json::object();
  if (inf.checkpoint_dir().empty()) {
    const std::string& path = plan.spec.model().init().safetensors();
    ASSIGN_OR_RETURN(const std::string digest, Sha256HexOfFile(path));
    model["safetensors"] = path;
    model["sha256"] = digest;
  } else {
    const std::string manifest =
        JoinPath(CheckpointStepDir(inf.checkpoint_dir(), inf.checkpoint_step()),
                 "manifest.json");
    ASSIGN_OR_RETURN(const std::string digest, Sha256HexOfFile(manifest));
    model["checkpoint_dir"] = inf.checkpoint_dir();
    model["step"] = inf.checkpoint_step();
    model["manifest_sha256"] = digest;
  }
  return model.dump(-1, ' ', false,
                    nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

absl::Status PinModelCheckpoint(JobPlan* plan) {
  auto* inf = plan->spec.mutable_inference();
  if (inf->checkpoint_dir().empty()) return absl::OkStatus();
  const std::string& dir = inf->checkpoint_dir();
  if (inf->checkpoint_step() > 0) {
    return Prefixed(VerifyCheckpoint(dir, inf->checkpoint_step()),
                    "inference.checkpoint_step: ");
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCompleteCheckpoints(dir));
  std::vector<std::string> failed;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    absl::Status st = VerifyCheckpoint(dir, *it);
    if (st.ok()) {
      inf->set_checkpoint_step(*it);
      return absl::OkStatus();
    }
    failed.push_back(absl::StrCat("step ", *it, ": ", st.message()));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "inference.checkpoint_dir: ", dir,
      steps.empty() ? " holds no complete checkpoint"
                    : absl::StrCat(" holds no checkpoint that verifies (",
                                   absl::StrJoin(failed, "; "), ")")));
}

absl::StatusOr<OutputJob> OutputJobOf(const JobPlan& plan) {
  OutputJob job;
  job.dir = plan.spec.inference().output_dir();
  ASSIGN_OR_RETURN(job.rows, EvalRows(plan));
  job.shard_rows = plan.spec.inference().shard_rows();
  ASSIGN_OR_RETURN(job.model_json, ModelJson(plan));
  job.spec_json = SpecToJson(plan.spec);
  // What does not change any row's outputs stays out of the identity, so a
  // job resumed with another layout continues the same outputs.
  JobSpec identity = plan.spec;
  identity.clear_name();
  identity.clear_recovery();
  auto* par = identity.mutable_parallelism();
  par->clear_stages();
  par->clear_replicas();
  par->clear_schedule();
  par->clear_split();
  par->clear_chunks();
  par->clear_accumulation();
  job.job_digest =
      Sha256Hex(absl::StrCat(SpecToJson(identity), job.model_json));
  return job;
}

std::pair<int64_t, int64_t> ShardRange(const JobPlan& plan, int64_t rows,
                                       int64_t shard) {
  const int64_t s = plan.spec.inference().shard_rows();
  return {std::min(rows, shard * s), std::min(rows, (shard + 1) * s)};
}

absl::StatusOr<OutputProgress> CountOutputs(const JobPlan& plan) {
  OutputProgress p;
  ASSIGN_OR_RETURN(p.rows_total, EvalRows(plan));
  const int64_t shard_rows = plan.spec.inference().shard_rows();
  p.shards_total = (p.rows_total + shard_rows - 1) / shard_rows;
  ASSIGN_OR_RETURN(
      std::vector<bool> done,
      CompleteShards(plan.spec.inference().output_dir(), p.shards_total));
  for (int64_t k = 0; k < p.shards_total; ++k) {
    if (!done[k]) continue;
    const auto [begin, end] = ShardRange(plan, p.rows_total, k);
    p.rows_done += end - begin;
    ++p.shards_done;
  }
  return p;
}

absl::Status FinishWhenComplete(const JobPlan& plan, OutputShards* outputs) {
  ASSIGN_OR_RETURN(const OutputProgress p, CountOutputs(plan));
  if (p.shards_done < p.shards_total) return absl::OkStatus();
  return outputs->Finish();
}

absl::StatusOr<std::unique_ptr<Stage>> StartForwardStage(
    const JobPlan& plan, int index, Transport* transport,
    const StageOptions& options) {
  ASSIGN_OR_RETURN(StageData data, LoadStageData(plan, index));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Stage> stage,
      Stage::Create(plan, index, transport, options, std::move(data)));
  const auto& inf = plan.spec.inference();
  if (inf.checkpoint_dir().empty()) {
    RETURN_IF_ERROR(stage->InitParameters());
  } else {
    RETURN_IF_ERROR(
        stage->LoadModel(inf.checkpoint_dir(), inf.checkpoint_step()));
  }
  return stage;
}

namespace {

absl::Status RunEvalJob(Stage& stage, const JobPlan& plan,
                        const ForwardRunOptions& options) {
  // The last replica's last stage is the one the service publishes.
  if (options.replica != plan.num_replicas() - 1) return absl::OkStatus();
  ASSIGN_OR_RETURN(EvalReport report, stage.RunEval());
  if (stage.is_last() && options.on_eval) {
    options.on_eval(stage.completed_steps(), report);
  }
  return absl::OkStatus();
}

absl::Status RunInferJob(Stage& stage, const JobPlan& plan,
                         const ForwardRunOptions& options) {
  if (stage.is_last() && options.outputs == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage.index(),
                     ": an inference job's last stage needs its "
                     "output folder"));
  }
  ASSIGN_OR_RETURN(const int64_t rows, EvalRows(plan));
  const int64_t shard_rows = plan.spec.inference().shard_rows();
  const int64_t batch = plan.spec.data().batch_size();
  const int64_t num_shards = (rows + shard_rows - 1) / shard_rows;
  const int64_t tags_per_shard = (shard_rows + batch - 1) / batch;
  // Every stage of this replica skips the same shards: those complete
  // before the job started (nobody else writes this replica's shards).
  ASSIGN_OR_RETURN(
      std::vector<bool> done,
      CompleteShards(plan.spec.inference().output_dir(), num_shards));
  const Stage::InferSink sink = [&](int64_t row, NamedTensors outputs) {
    return options.outputs->Add(row, outputs);
  };
  absl::Time start = absl::Now();
  for (int64_t k = options.replica; k < num_shards; k += plan.num_replicas()) {
    if (options.cancel != nullptr && options.cancel->load()) {
      return absl::CancelledError(
          absl::StrCat("stage ", stage.index(), " cancelled before shard ", k));
    }
    if (done[k]) continue;
    const auto [begin, end] = ShardRange(plan, rows, k);
    RETURN_IF_ERROR(stage.RunInference(begin, end, k * tags_per_shard, sink,
                                       options.cancel));
    if (stage.is_last() && options.on_shard) {
      const absl::Time now = absl::Now();
      options.on_shard(k, end - begin, absl::ToDoubleSeconds(now - start));
      start = now;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunForwardStage(Stage& stage, const JobPlan& plan,
                             const ForwardRunOptions& options) {
  RETURN_IF_ERROR(stage.exec().Activate());
  RETURN_IF_ERROR(CheckResumedTogether(stage, options.transport,
                                       plan.num_stages(), options.timeout));
  if (plan.kind == JobKind::kEval) {
    RETURN_IF_ERROR(RunEvalJob(stage, plan, options));
  } else if (plan.kind == JobKind::kInfer) {
    RETURN_IF_ERROR(RunInferJob(stage, plan, options));
  } else {
    return absl::InvalidArgumentError(
        "RunForwardStage: a training job (kind \"train\") runs RunStage");
  }
  RETURN_IF_ERROR(stage.NotifyTask(TRAINYARD_EVENT_JOB_END, "completed"));
  return stage.Finalize();
}

}  // namespace trainyard
