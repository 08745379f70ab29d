#include "engine/local_job.h"

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "core/status_macros.h"
#include "engine/forward_job.h"
#include "engine/output_shards.h"
#include "engine/replica_group.h"
#include "engine/shared_device_replicas.h"
#include "engine/stage_runner.h"
#include "engine/stage_wiring.h"
#include "kernels/blas.h"
#include "transport/in_process_transport.h"

namespace trainyard {
namespace {

std::string Num(double v) { return absl::StrFormat("%.17g", v); }

// A JSON string literal: plugin metric names are arbitrary text.
std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// Plugin metrics whose names collide with the engine's keys (a plugin may
// well report its own "loss") are prefixed with "task_".
std::string MetricsJson(
    const std::vector<std::pair<std::string, double>>& metrics,
    const std::string& prefix) {
  static const char* const kReserved[] = {
      "step", "loss", "lr", "grad_norm", "samples_per_sec", "samples"};
  std::string out;
  for (const auto& [name, value] : metrics) {
    std::string key = name;
    for (const char* r : kReserved) {
      if (key == r) key = "task_" + key;
    }
    absl::StrAppend(&out, ",", JsonString(prefix + key), ":", Num(value));
  }
  return out;
}

// The stages of one job as threads of this process: R replicas
// (parallelism.replicas) of the S-stage pipeline, each replica's stages
// connected by its own in-process transport; the copies of stage s sum
// their gradients through a replica group (Gloo over loopback, rendezvous
// in this process) and, on a device, through shared device replicas.
class LocalGang {
 public:
  LocalGang(const JobPlan& plan, const LocalJobOptions& options)
      : plan_(plan), options_(options), gang_(plan.gang()) {
    for (int r = 0; r < gang_.replicas; ++r) {
      hubs_.push_back(std::make_unique<InProcessHub>(gang_.stages));
    }
    groups_.resize(gang_.size());
    // Replicas on one device sum their gradients there, not through the
    // host.
    if (gang_.replicas > 1 && !options.device.is_cpu()) {
      for (int s = 0; s < gang_.stages; ++s) {
        device_replicas_.push_back(
            std::make_unique<SharedDeviceReplicas>(gang_.replicas));
      }
    }
  }

  // An inference job's output folder, shared by its replicas' last stages.
  void set_outputs(OutputShards* outputs) { outputs_ = outputs; }

  // Every stage joins the group of its copies, all at once (each join
  // waits for the others). The first error, if any.
  absl::Status JoinReplicaGroups();
  // Builds every stage, each with its own context on the one device (so
  // that each counts its own copies; they share the device's stream and
  // memory), and initialises or restores it.
  absl::Status StartStages(Precision precision);
  // Runs every stage on its own thread, the first on this one; returns the
  // first error (the root cause, not the aborts it caused).
  absl::Status Run();

 private:
  Transport* TransportOf(int r, int s) { return hubs_[r]->rank(s); }
  StageRunOptions RunOptions(int r, int s, bool last);
  ForwardRunOptions ForwardOptions(int r, int s, bool last);
  void RunOne(int r, int s);
  // Keeps `st` as the job's error if it is the first (or the first that
  // is not an abort) and stops every replica's stage s: their group calls
  // would otherwise wait out their timeout.
  void Fail(int r, int s, const absl::Status& st);

  const JobPlan& plan_;
  const LocalJobOptions& options_;
  const Gang gang_;
  std::vector<std::unique_ptr<InProcessHub>> hubs_;
  InProcessRendezvous rendezvous_;
  std::vector<std::unique_ptr<ReplicaGroup>> groups_;  // by gang rank
  std::vector<std::unique_ptr<SharedDeviceReplicas>> device_replicas_;
  std::vector<std::unique_ptr<ExecContext>> contexts_;  // outlive the stages
  std::vector<std::unique_ptr<Stage>> stages_;          // by gang rank
  OutputShards* outputs_ = nullptr;
  absl::Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

absl::Status LocalGang::JoinReplicaGroups() {
  // A forward-only job's replicas never talk to each other.
  if (gang_.replicas <= 1 || !plan_.trains()) return absl::OkStatus();
  absl::Mutex join_mu;
  absl::Status join_error;
  std::vector<std::thread> joiners;
  for (int rank = 0; rank < gang_.size(); ++rank) {
    joiners.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<ReplicaGroup>> g =
          JoinStageReplicas(&rendezvous_, gang_, rank, "local",
                            ReplicaGroupOptions().hostname, options_.timeout);
      absl::MutexLock lock(&join_mu);
      if (g.ok()) {
        groups_[rank] = *std::move(g);
      } else if (join_error.ok()) {
        join_error = g.status();
      }
    });
  }
  for (auto& t : joiners) t.join();
  return join_error;
}

absl::Status LocalGang::StartStages(Precision precision) {
  StageOptions base;
  base.plugin_dir = options_.plugin_dir;
  base.timeout = options_.timeout;
  base.host_loss = options_.host_loss;
  base.device_data_bytes = options_.device_data_bytes;
  int64_t resume_step = 0;
  for (int rank = 0; rank < gang_.size(); ++rank) {
    const int r = gang_.ReplicaOf(rank);
    const int s = gang_.StageOf(rank);
    ASSIGN_OR_RETURN(std::unique_ptr<ExecContext> exec,
                     ExecContext::Create(options_.device, precision));
    StageOptions stage_options =
        GangStageOptions(base, gang_, rank, exec.get(), groups_[rank].get());
    contexts_.push_back(std::move(exec));
    stage_options.device_replicas =
        device_replicas_.empty() ? nullptr : device_replicas_[s].get();
    if (!plan_.trains()) {
      ASSIGN_OR_RETURN(
          std::unique_ptr<Stage> stage,
          StartForwardStage(plan_, s, TransportOf(r, s), stage_options));
      stages_.push_back(std::move(stage));
      continue;
    }
    ASSIGN_OR_RETURN(StartedStage started,
                     StartStage(plan_, s, TransportOf(r, s), stage_options));
    resume_step = started.resume_step;
    if (options_.on_log && r == 0) {
      for (const std::string& line : started.set_aside) {
        options_.on_log("checkpoint set aside: " + line);
      }
    }
    stages_.push_back(std::move(started.stage));
  }
  if (resume_step > 0 && options_.on_log) {
    options_.on_log(absl::StrCat("resumed from ", plan_.spec.checkpoint().dir(),
                                 " at step ", resume_step));
  }
  return absl::OkStatus();
}

StageRunOptions LocalGang::RunOptions(int r, int s, bool last) {
  StageRunOptions run =
      GangRunOptions(gang_, gang_.RankOf(r, s), options_.timeout);
  run.stop_after_step = options_.stop_after_step;
  // Replicas hold the same state and losses: the first reports and
  // writes checkpoints.
  if (last && r == 0) {
    run.on_step = options_.on_step;
    run.on_eval = options_.on_eval;
  }
  if (options_.on_stage_step) {
    run.on_step = [this, r, s, own = run.on_step](const StepReport& report,
                                                  double seconds) {
      if (own) own(report, seconds);
      options_.on_stage_step(r, s, report, seconds);
    };
  }
  if (run.write_checkpoints) run.on_checkpoint = options_.on_checkpoint;
  return run;
}

ForwardRunOptions LocalGang::ForwardOptions(int r, int s, bool last) {
  ForwardRunOptions run;
  run.replica = r;
  run.transport = gang_.stages > 1 ? TransportOf(r, s) : nullptr;
  run.timeout = options_.timeout;
  if (last) {
    run.outputs = outputs_;
    run.on_shard = options_.on_shard;
    run.on_eval = options_.on_eval;  // called by the one replica that evals
  }
  return run;
}

void LocalGang::RunOne(int r, int s) {
  Stage& stage = *stages_[gang_.RankOf(r, s)];
  absl::Status st =
      plan_.trains() ? RunStage(stage, TransportOf(r, s), plan_,
                                RunOptions(r, s, stage.is_last()))
                     : RunForwardStage(stage, plan_,
                                       ForwardOptions(r, s, stage.is_last()));
  if (st.ok() && options_.on_final_params && r == 0) {
    absl::StatusOr<NamedTensors> params = stage.NamedParametersOnHost();
    st = params.status();
    if (st.ok()) options_.on_final_params(s, *params);
  }
  if (!st.ok()) Fail(r, s, st);
}

void LocalGang::Fail(int r, int s, const absl::Status& st) {
  absl::MutexLock lock(&mu_);
  if (first_error_.ok() ||
      (absl::IsAborted(first_error_) && !absl::IsAborted(st))) {
    first_error_ = st;
  }
  const absl::Status failure =
      StageFailure(gang_, gang_.RankOf(r, s), st,
                   /*name_replica=*/gang_.replicas > 1);
  for (int q = 0; q < gang_.replicas; ++q) TransportOf(q, s)->Abort(failure);
  for (auto& group : device_replicas_) {
    group->Abort(std::string(failure.message()));
  }
}

absl::Status LocalGang::Run() {
  std::vector<std::thread> threads;
  for (int rank = 1; rank < gang_.size(); ++rank) {
    threads.emplace_back(
        [this, rank] { RunOne(gang_.ReplicaOf(rank), gang_.StageOf(rank)); });
  }
  RunOne(0, 0);
  for (auto& t : threads) t.join();
  stages_.clear();
  HostAllocator()->EmptyCache();
  absl::MutexLock lock(&mu_);
  return first_error_;
}

// An infer or eval job: the model pinned, the stages started (each loads
// and checks its part of the model), the output folder opened (its
// refusals before any row is read), the stages run, the folder finished.
absl::Status RunForwardJob(JobPlan plan, const LocalJobOptions& options,
                           Precision precision) {
  RETURN_IF_ERROR(PinModelCheckpoint(&plan));
  LocalGang gang(plan, options);
  // The model is checked against the spec (StartStages loads it) before
  // the output folder is made.
  RETURN_IF_ERROR(gang.StartStages(precision));
  std::unique_ptr<OutputShards> outputs;
  if (plan.kind == JobKind::kInfer) {
    ASSIGN_OR_RETURN(OutputJob job, OutputJobOf(plan));
    ASSIGN_OR_RETURN(outputs, OutputShards::Open(job));
  }
  gang.set_outputs(outputs.get());
  RETURN_IF_ERROR(gang.Run());
  return outputs != nullptr ? outputs->Finish() : absl::OkStatus();
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
  if (options.threads > 0) SetBlasThreads(options.threads);
  if (plan.spec.device() != options.device.KindName()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the spec's device is \"", plan.spec.device(),
                     "\" but the job runs on ", options.device.ToString()));
  }
  ASSIGN_OR_RETURN(const Precision precision,
                   PrecisionFromName(plan.spec.precision()));
  if (!plan.trains()) return RunForwardJob(plan, options, precision);
  LocalGang gang(plan, options);
  RETURN_IF_ERROR(gang.JoinReplicaGroups());
  RETURN_IF_ERROR(gang.StartStages(precision));
  return gang.Run();
}

}  // namespace trainyard
