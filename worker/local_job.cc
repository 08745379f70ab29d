#include "worker/local_job.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/in_process_transport.h"
#include "core/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/blas.h"
#include "worker/checkpoint_store.h"

namespace trainyard {
namespace {

std::string Num(double v) { return absl::StrFormat("%.17g", v); }

// Plugin metrics whose names collide with the engine's keys (a plugin may
// well report its own "loss") are prefixed with "task_".
std::string MetricsJson(
    const std::vector<std::pair<std::string, double>>& metrics,
    const std::string& prefix) {
  static const char* const kReserved[] = {"step", "loss", "lr", "grad_norm",
                                          "samples_per_sec", "samples"};
  std::string out;
  for (const auto& [name, value] : metrics) {
    std::string key = name;
    for (const char* r : kReserved) {
      if (key == r) key = "task_" + key;
    }
    absl::StrAppend(&out, ",\"", prefix, key, "\":", Num(value));
  }
  return out;
}

// What the manifest records about the job: the normalized spec, so a
// checkpoint says what produced it.
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

bool Due(int64_t step, int64_t every, int64_t last_step) {
  return every > 0 && (step % every == 0 || step == last_step);
}

}  // namespace

std::string StepJson(const StepReport& r, double step_seconds) {
  return absl::StrCat(
      "{\"step\":", r.step, ",\"loss\":", Num(r.loss), ",\"lr\":", Num(r.lr),
      ",\"grad_norm\":", Num(r.grad_norm), ",\"samples_per_sec\":",
      absl::StrFormat("%.1f", step_seconds > 0 ? r.samples / step_seconds : 0),
      MetricsJson(r.metrics, ""), "}");
}

std::string EvalJson(int64_t step, const EvalReport& r) {
  return absl::StrCat("{\"step\":", step, ",\"eval_loss\":", Num(r.loss),
                      ",\"eval_samples\":", r.samples,
                      MetricsJson(r.metrics, "eval_"), "}");
}

absl::Status RunLocalJob(const JobPlan& plan, const LocalJobOptions& options) {
  const auto& spec = plan.spec;
  const int S = plan.num_stages();
  if (options.threads > 0) SetBlasThreads(options.threads);

  // Data: only the first stage reads rows.
  ASSIGN_OR_RETURN(Dataset train_all,
                   LoadDataSource(spec.data().train(), "", spec.data().seed()));
  auto train = std::make_shared<Dataset>();
  auto eval = std::make_shared<Dataset>();
  bool have_eval = false;
  if (spec.data().has_eval()) {
    *train = std::move(train_all);
    ASSIGN_OR_RETURN(*eval,
                     LoadDataSource(spec.data().eval(), "", spec.data().seed()));
    have_eval = true;
  } else if (spec.data().eval_fraction() > 0) {
    ASSIGN_OR_RETURN(auto split,
                     SplitTail(train_all, spec.data().eval_fraction()));
    *train = std::move(split.first);
    *eval = std::move(split.second);
    have_eval = true;
  } else {
    *train = std::move(train_all);
  }
  const int64_t eval_rows = have_eval ? eval->features.dim(0) : 0;

  // Checkpoint to resume from.
  const auto& ckpt = spec.checkpoint();
  int64_t resume_step = 0;
  if (!ckpt.dir().empty()) {
    ASSIGN_OR_RETURN(std::optional<int64_t> latest, LatestCheckpoint(ckpt.dir()));
    if (latest.has_value()) {
      if (ckpt.resume() != "latest") {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint.dir: ", ckpt.dir(), " already holds checkpoints (newest: step ",
            *latest, "); set checkpoint.resume to \"latest\" to continue from it, "
            "or use an empty folder"));
      }
      resume_step = *latest;
    }
  }

  InProcessHub hub(S);
  StageOptions stage_options;
  stage_options.plugin_dir = options.plugin_dir;
  stage_options.timeout = options.timeout;
  std::vector<std::unique_ptr<Stage>> stages;
  for (int s = 0; s < S; ++s) {
    StageData data;
    data.eval_rows = eval_rows;
    if (s == 0) {
      data.train = train;
      if (have_eval) data.eval = eval;
    }
    ASSIGN_OR_RETURN(auto stage,
                     Stage::Create(plan, s, hub.rank(s), stage_options, data));
    if (resume_step > 0) {
      RETURN_IF_ERROR(stage->RestoreCheckpoint(ckpt.dir(), resume_step));
    } else {
      RETURN_IF_ERROR(stage->InitParameters());
    }
    stages.push_back(std::move(stage));
  }
  if (resume_step > 0 && options.on_log) {
    options.on_log(absl::StrCat("resumed from ", ckpt.dir(), " at step ",
                                resume_step));
  }

  const int64_t last_step = spec.steps();
  const int64_t stop = options.stop_after_step > 0
                           ? std::min(options.stop_after_step, last_step)
                           : last_step;
  absl::Mutex mu;
  absl::Status first_error;  // the root cause, not the aborts it caused
  auto fail = [&](int s, absl::Status st) {
    absl::MutexLock lock(&mu);
    if (first_error.ok() || (absl::IsAborted(first_error) && !absl::IsAborted(st))) {
      first_error = st;
    }
    hub.rank(s)->Abort(absl::Status(
        st.code(), absl::StrCat("stage ", s, " failed: ", st.message())));
  };

  auto run_stage = [&](int s) {
    Stage& stage = *stages[s];
    Transport* transport = hub.rank(s);
    absl::Time step_start = absl::Now();
    while (stage.completed_steps() < stop) {
      absl::StatusOr<StepReport> report = stage.RunStep();
      if (!report.ok()) return fail(s, report.status());
      const int64_t step = report->step;
      const absl::Time now = absl::Now();
      if (stage.is_last() && options.on_step) {
        options.on_step(*report, absl::ToDoubleSeconds(now - step_start));
      }
      if (have_eval && Due(step, spec.data().eval_every(), last_step)) {
        absl::StatusOr<EvalReport> eval_report = stage.RunEval();
        if (!eval_report.ok()) return fail(s, eval_report.status());
        if (stage.is_last() && options.on_eval) options.on_eval(step, *eval_report);
      }
      if (!ckpt.dir().empty() && Due(step, ckpt.every(), last_step)) {
        absl::StatusOr<std::string> written = stage.WriteCheckpointFile(ckpt.dir());
        if (!written.ok()) return fail(s, written.status());
        // Barrier: the manifest goes in only after every stage file is there.
        std::vector<double> done = {1.0};
        if (S > 1) {
          absl::Status st = transport->AllReduceSum(&done, options.timeout);
          if (!st.ok()) return fail(s, st);
        }
        if (stage.is_first()) {
          absl::Status st = CommitCheckpoint(ckpt.dir(), step, S,
                                             PlanMetadataJson(plan, step));
          if (st.ok()) st = PruneCheckpoints(ckpt.dir(), ckpt.keep_last());
          if (!st.ok()) return fail(s, st);
          if (options.on_checkpoint) options.on_checkpoint(step, ckpt.dir());
        }
        absl::Status st = stage.NotifyTask(TRAINYARD_EVENT_CHECKPOINT_SAVED,
                                           ckpt.dir());
        if (!st.ok()) return fail(s, st);
      }
      step_start = absl::Now();
    }
    absl::Status st = stage.NotifyTask(TRAINYARD_EVENT_JOB_END,
                                       stop == last_step ? "completed" : "stopped");
    if (st.ok()) st = stage.Finalize();
    if (!st.ok()) return fail(s, st);
    if (options.on_final_params) options.on_final_params(s, stage.NamedParameters());
  };

  std::vector<std::thread> threads;
  for (int s = 1; s < S; ++s) threads.emplace_back(run_stage, s);
  run_stage(0);
  for (auto& t : threads) t.join();
  absl::MutexLock lock(&mu);
  return first_error;
}

}  // namespace trainyard
