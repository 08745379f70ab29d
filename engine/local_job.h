// RunLocalJob: a whole training job in one process, each pipeline stage a
// thread, stages connected by the in-process transport. This is what
// `trainyard train` runs, and the reference the distributed service must
// match bitwise.
//
// Thread safety: the callbacks are called from the last stage's thread, one
// at a time.
#ifndef TRAINYARD_ENGINE_LOCAL_JOB_H_
#define TRAINYARD_ENGINE_LOCAL_JOB_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/device.h"
#include "core/tensor.h"
#include "engine/stage_report.h"
#include "plan/job_plan.h"

namespace trainyard {

struct LocalJobOptions {
  std::string plugin_dir;
  // Where every stage runs (stages as threads on one device); its kind must
  // be the spec's device. Precision: spec.precision.
  Device device = Device::Cpu();
  // BLAS threads for the process (shared by all stages); 0 = leave as is.
  int threads = 0;
  // StageOptions::host_loss and device_data_bytes for every stage.
  bool host_loss = false;
  int64_t device_data_bytes = -1;
  // Stop (successfully) once this many steps are complete, as if the job
  // had been interrupted there; 0 = run spec.steps.
  int64_t stop_after_step = 0;
  absl::Duration timeout = absl::Minutes(2);
  // Called once per step with the last stage's report and the wall time of
  // the step.
  std::function<void(const StepReport&, double step_seconds)> on_step;
  // Called by every stage of every replica after each of its steps, with
  // its own report (times, trace) and step time. Runs concurrently on the
  // stages' threads: synchronise shared state.
  std::function<void(int replica, int stage, const StepReport&,
                     double step_seconds)>
      on_stage_step;
  // Called after each eval pass with the completed step count (an eval
  // job: once, with its model's step).
  std::function<void(int64_t step, const EvalReport&)> on_eval;
  // An inference job: called after each output shard is written, with its
  // rows and the seconds its replica took for it. Runs concurrently on the
  // replicas' last stages: synchronise shared state.
  std::function<void(int64_t shard, int64_t rows, double seconds)> on_shard;
  // Called when a checkpoint has been committed, from the first stage's
  // checkpoint writer thread (checkpoints commit in the background), at the
  // same time as on_step / on_eval may run: synchronise shared state.
  std::function<void(int64_t step, const std::string& dir)> on_checkpoint;
  // Called by each stage when it finishes, with its parameters on the host
  // (views that die with the job: copy what you keep). May run
  // concurrently.
  std::function<void(int stage, const NamedTensors&)> on_final_params;
  // Called with a line of progress for humans (resume, checkpoints).
  std::function<void(const std::string&)> on_log;
};

// Runs `plan` to completion (or stop_after_step). Resumes from the newest
// checkpoint when spec.checkpoint.resume is "latest". An infer or eval job
// (engine/forward_job.h) runs its rows once; an inference job resumes from
// the complete shards of its output folder. The first error of any stage
// stops all stages and is returned, naming the stage.
absl::Status RunLocalJob(const JobPlan& plan, const LocalJobOptions& options);

// Formats one step as the JSON line `trainyard train` prints:
// {"step":1,"loss":...,"lr":...,"grad_norm":...,"samples_per_sec":...,
//  <plugin metrics>}. Losses print with 17 significant digits, so equal
// lines mean bitwise-equal losses.
std::string StepJson(const StepReport& report, double step_seconds);
std::string EvalJson(int64_t step, const EvalReport& report);

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_LOCAL_JOB_H_
