#include "engine/local_job.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "transport/in_process_transport.h"
#include "core/status_macros.h"
#include "kernels/blas.h"
#include "engine/replica_group.h"
#include "engine/stage_runner.h"

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
  const int S = plan.num_stages();
  if (options.threads > 0) SetBlasThreads(options.threads);
  if (plan.spec.device() != options.device.KindName()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the spec's device is \"", plan.spec.device(),
                     "\" but the job runs on ", options.device.ToString()));
  }
  ASSIGN_OR_RETURN(const Precision precision,
                   PrecisionFromName(plan.spec.precision()));
  // R replicas of the S-stage pipeline (parallelism.replicas): each its own
  // in-process transport; the copies of stage s sum their gradients through
  // a replica group (Gloo over loopback, rendezvous in this process).
  const int R = std::max(1, plan.spec.parallelism().replicas());
  std::vector<std::unique_ptr<InProcessHub>> hubs;
  for (int r = 0; r < R; ++r) hubs.push_back(std::make_unique<InProcessHub>(S));
  InProcessRendezvous rendezvous;
  std::vector<std::vector<std::unique_ptr<ReplicaGroup>>> groups(R);
  for (auto& g : groups) g.resize(S);
  if (R > 1) {
    absl::Mutex join_mu;
    absl::Status join_error;
    std::vector<std::thread> joiners;
    for (int r = 0; r < R; ++r) {
      for (int s = 0; s < S; ++s) {
        joiners.emplace_back([&, r, s] {
          ReplicaGroupOptions o;
          o.rank = r;
          o.size = R;
          o.key_prefix = absl::StrCat("local/stage-", s);
          o.timeout = options.timeout;
          absl::StatusOr<std::unique_ptr<ReplicaGroup>> g =
              ReplicaGroup::Join(&rendezvous, o);
          absl::MutexLock lock(&join_mu);
          if (g.ok()) {
            groups[r][s] = *std::move(g);
          } else if (join_error.ok()) {
            join_error = g.status();
          }
        });
      }
    }
    for (auto& t : joiners) t.join();
    if (!join_error.ok()) return join_error;
  }
  // Replicas on one device sum their gradients there, not through the host.
  std::vector<std::unique_ptr<SharedDeviceReplicas>> device_replicas;
  if (R > 1 && !options.device.is_cpu()) {
    for (int s = 0; s < S; ++s) {
      device_replicas.push_back(std::make_unique<SharedDeviceReplicas>(R));
    }
  }
  StageOptions stage_options;
  stage_options.plugin_dir = options.plugin_dir;
  stage_options.timeout = options.timeout;
  stage_options.host_loss = options.host_loss;
  stage_options.device_data_bytes = options.device_data_bytes;
  // stages[plan.gang().RankOf(r, s)], each with its own context on the one device (so that
  // each counts its own copies; they share the device's stream and memory).
  std::vector<std::unique_ptr<ExecContext>> contexts;  // outlive the stages
  std::vector<std::unique_ptr<Stage>> stages;
  int64_t resume_step = 0;
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < S; ++s) {
      ASSIGN_OR_RETURN(std::unique_ptr<ExecContext> exec,
                       ExecContext::Create(options.device, precision));
      stage_options.exec = exec.get();
      contexts.push_back(std::move(exec));
      stage_options.replica = r;
      stage_options.replica_group = groups[r][s].get();
      stage_options.device_replicas =
          device_replicas.empty() ? nullptr : device_replicas[s].get();
      ASSIGN_OR_RETURN(StartedStage started,
                       StartStage(plan, s, hubs[r]->rank(s), stage_options));
      resume_step = started.resume_step;
      if (options.on_log && r == 0) {
        for (const std::string& line : started.set_aside) {
          options.on_log("checkpoint set aside: " + line);
        }
      }
      stages.push_back(std::move(started.stage));
    }
  }
  if (resume_step > 0 && options.on_log) {
    options.on_log(absl::StrCat("resumed from ", plan.spec.checkpoint().dir(),
                                " at step ", resume_step));
  }

  absl::Mutex mu;
  absl::Status first_error;  // the root cause, not the aborts it caused
  auto run_stage = [&](int r, int s) {
    Stage& stage = *stages[plan.gang().RankOf(r, s)];
    StageRunOptions run;
    run.stop_after_step = options.stop_after_step;
    run.timeout = options.timeout;
    // Replicas hold the same state and losses: the first reports and
    // writes checkpoints.
    if (stage.is_last() && r == 0) {
      run.on_step = options.on_step;
      run.on_eval = options.on_eval;
    }
    if (options.on_stage_step) {
      run.on_step = [&options, r, s, own = run.on_step](
                        const StepReport& report, double seconds) {
        if (own) own(report, seconds);
        options.on_stage_step(r, s, report, seconds);
      };
    }
    run.write_checkpoints = r == 0;
    if (r == 0) run.on_checkpoint = options.on_checkpoint;
    absl::Status st = RunStage(stage, hubs[r]->rank(s), plan, run);
    if (st.ok() && options.on_final_params && r == 0) {
      absl::StatusOr<NamedTensors> params = stage.NamedParametersOnHost();
      st = params.status();
      if (st.ok()) options.on_final_params(s, *params);
    }
    if (st.ok()) return;
    absl::MutexLock lock(&mu);
    if (first_error.ok() ||
        (absl::IsAborted(first_error) && !absl::IsAborted(st))) {
      first_error = st;
    }
    // A replica's failure stops every replica: their group calls would
    // otherwise wait out their timeout.
    const std::string why =
        absl::StrCat(R > 1 ? absl::StrCat("replica ", r, " ") : "", "stage ", s,
                     " failed: ", st.message());
    for (int q = 0; q < R; ++q) {
      hubs[q]->rank(s)->Abort(absl::Status(st.code(), why));
    }
    for (auto& group : device_replicas) group->Abort(why);
  };

  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < S; ++s) {
      if (r == 0 && s == 0) continue;
      threads.emplace_back(run_stage, r, s);
    }
  }
  run_stage(0, 0);
  for (auto& t : threads) t.join();
  stages.clear();
  HostAllocator()->EmptyCache();
  absl::MutexLock lock(&mu);
  return first_error;
}

}  // namespace trainyard
