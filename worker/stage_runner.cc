#include "worker/stage_runner.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/npy.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"
#include "worker/checkpoint_store.h"
#include "worker/dataset.h"

namespace trainyard {
namespace {

// Evals: every `every` steps and after the last; never when every is 0.
bool Due(int64_t step, int64_t every, int64_t last_step) {
  return every > 0 && (step % every == 0 || step == last_step);
}

// Checkpoints (when a dir is set): every `every` steps and after the last
// step; only after the last step when every is 0.
bool CheckpointDue(int64_t step, int64_t every, int64_t last_step) {
  return step == last_step || (every > 0 && step % every == 0);
}

}  // namespace

absl::StatusOr<int64_t> EvalRows(const JobPlan& plan) {
  const auto& data = plan.spec.data();
  if (data.has_eval()) {
    if (data.eval().has_synthetic())
      return data.eval().synthetic().num_samples();
    ASSIGN_OR_RETURN(NpyHeader header,
                     ReadNpyHeader(data.eval().npy().features()));
    return header.shape.empty() ? 0 : header.shape[0];
  }
  if (data.eval_fraction() > 0) {
    return static_cast<int64_t>(std::floor(
        static_cast<double>(plan.train_rows) * data.eval_fraction()));
  }
  return 0;
}

absl::StatusOr<StageData> LoadStageData(const JobPlan& plan, int stage) {
  StageData out;
  ASSIGN_OR_RETURN(out.eval_rows, EvalRows(plan));
  if (stage != 0) return out;
  const auto& data = plan.spec.data();
  auto with_field = [](const char* field, absl::Status st) {
    return absl::Status(st.code(), absl::StrCat(field, ": ", st.message()));
  };
  absl::StatusOr<Dataset> train = LoadDataSource(data.train(), "", data.seed());
  if (!train.ok()) return with_field("data.train", train.status());
  if (data.has_eval()) {
    absl::StatusOr<Dataset> eval =
        LoadDataSource(data.eval(), "", data.seed(), DataSplit::kEval);
    if (!eval.ok()) return with_field("data.eval", eval.status());
    out.train = std::make_shared<Dataset>(std::move(*train));
    out.eval = std::make_shared<Dataset>(std::move(*eval));
  } else if (data.eval_fraction() > 0) {
    auto split = SplitTail(*train, data.eval_fraction());
    if (!split.ok()) return with_field("data.eval_fraction", split.status());
    out.train = std::make_shared<Dataset>(std::move(split->first));
    out.eval = std::make_shared<Dataset>(std::move(split->second));
  } else {
    out.train = std::make_shared<Dataset>(std::move(*train));
  }
  if (out.eval != nullptr && out.eval->num_rows() != out.eval_rows) {
    return absl::InternalError(
        absl::StrCat("eval set has ", out.eval->num_rows(),
                     " rows, the plan says ", out.eval_rows));
  }
  return out;
}

absl::StatusOr<int64_t> ResumeStep(const JobPlan& plan,
                                   std::vector<std::string>* set_aside) {
  const auto& ckpt = plan.spec.checkpoint();
  if (ckpt.dir().empty()) return 0;
  ASSIGN_OR_RETURN(std::optional<int64_t> latest, LatestCheckpoint(ckpt.dir()));
  if (!latest.has_value()) return 0;
  if (ckpt.resume() != "latest") {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.dir: ", ckpt.dir(),
        " already holds checkpoints (newest: step ", *latest,
        "); set checkpoint.resume to \"latest\" to continue from it, or use "
        "an empty folder"));
  }
  ASSIGN_OR_RETURN(VerifiedCheckpoint verified,
                   LatestVerifiedCheckpoint(ckpt.dir()));
  for (const std::string& line : verified.set_aside) {
    LOG(WARNING) << "checkpoint set aside: " << line;
    if (set_aside != nullptr) set_aside->push_back(line);
  }
  return verified.step.value_or(0);
}

std::string PlanMetadataJson(const JobPlan& plan, int64_t step) {
  std::string spec_json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(plan.spec, &spec_json, opts)
           .ok()) {
    spec_json = "null";
  }
  return absl::StrCat("{\"step\":", step, ",\"stages\":", plan.num_stages(),
                      ",\"spec\":", spec_json, "}");
}

absl::StatusOr<StartedStage> StartStage(const JobPlan& plan, int index,
                                        Transport* transport,
                                        const StageOptions& options) {
  StartedStage out;
  ASSIGN_OR_RETURN(StageData data, LoadStageData(plan, index));
  ASSIGN_OR_RETURN(out.stage, Stage::Create(plan, index, transport, options,
                                            std::move(data)));
  ASSIGN_OR_RETURN(out.resume_step, ResumeStep(plan, &out.set_aside));
  if (out.resume_step > 0) {
    RETURN_IF_ERROR(out.stage->RestoreCheckpoint(plan.spec.checkpoint().dir(),
                                                 out.resume_step));
  } else {
    RETURN_IF_ERROR(out.stage->InitParameters());
  }
  return out;
}

absl::Status RunStage(Stage& stage, Transport* transport, const JobPlan& plan,
                      const StageRunOptions& options) {
  RETURN_IF_ERROR(stage.exec().Activate());
  const auto& spec = plan.spec;
  const auto& ckpt = spec.checkpoint();
  const int S = plan.num_stages();
  const int64_t last_step = spec.steps();
  const int64_t stop = options.stop_after_step > 0
                           ? std::min(options.stop_after_step, last_step)
                           : last_step;
  ASSIGN_OR_RETURN(const int64_t eval_rows, EvalRows(plan));
  absl::Time step_start = absl::Now();
  while (stage.completed_steps() < stop) {
    if (options.cancel != nullptr && options.cancel->load()) {
      return absl::CancelledError(absl::StrCat("stage ", stage.index(),
                                               " cancelled after step ",
                                               stage.completed_steps()));
    }
    ASSIGN_OR_RETURN(StepReport report, stage.RunStep());
    const int64_t step = report.step;
    if (options.on_step) {
      options.on_step(report, absl::ToDoubleSeconds(absl::Now() - step_start));
    }
    if (eval_rows > 0 && Due(step, spec.data().eval_every(), last_step)) {
      ASSIGN_OR_RETURN(EvalReport eval, stage.RunEval());
      if (options.on_eval) options.on_eval(step, eval);
    }
    if (!ckpt.dir().empty() && CheckpointDue(step, ckpt.every(), last_step)) {
      RETURN_IF_ERROR(stage.WriteCheckpointFile(ckpt.dir()).status());
      // Barrier: the manifest goes in only after every stage file is there.
      if (S > 1) {
        std::vector<double> done = {1.0};
        RETURN_IF_ERROR(transport->AllReduceSum(&done, options.timeout));
      }
      if (stage.is_first()) {
        RETURN_IF_ERROR(CommitCheckpoint(ckpt.dir(), step, S,
                                         PlanMetadataJson(plan, step)));
        RETURN_IF_ERROR(PruneCheckpoints(ckpt.dir(), ckpt.keep_last()));
        if (options.on_checkpoint) options.on_checkpoint(step, ckpt.dir());
      }
      RETURN_IF_ERROR(
          stage.NotifyTask(TRAINYARD_EVENT_CHECKPOINT_SAVED, ckpt.dir()));
    }
    step_start = absl::Now();
  }
  RETURN_IF_ERROR(stage.NotifyTask(
      TRAINYARD_EVENT_JOB_END, stop == last_step ? "completed" : "stopped"));
  return stage.Finalize();
}

}  // namespace trainyard
