// The stage loop of a forward-only job (JobSpec.kind "infer" or "eval"),
// shared by `trainyard infer` / `trainyard eval` (every stage a thread) and
// the worker daemon (one stage per process), beside engine/stage_runner.h's
// training loop.
//
// The rows: data.eval when given; else the rows of data.train a training
// job holds out (data.eval_fraction); else all of data.train. The model:
// the parameters of a checkpoint (inference.checkpoint_dir and
// checkpoint_step, pinned before the stages start) or
// model.init.safetensors.
//
// An inference job cuts its N rows into shards of inference.shard_rows (the
// last shorter); shard k is replica k mod R's, and each shard's rows go
// through the pipeline in batches of data.batch_size from the shard's first
// row, each cut into microbatches as an eval batch is. So a row's microbatch
// does not depend on the stage count, replica count or schedule, and a
// resumed job recomputes only the shards that were not complete. The last
// stage of each replica writes its shards (engine/output_shards.h); every
// stage skips the shards whose folders are complete when it starts. An
// evaluation job runs the training job's eval pass (Stage::RunEval) on the
// last replica; the other replicas have nothing to do.
//
// Thread safety: the functions keep no state of their own; callbacks are
// called from the calling thread.
#ifndef TRAINYARD_ENGINE_FORWARD_JOB_H_
#define TRAINYARD_ENGINE_FORWARD_JOB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/output_shards.h"
#include "engine/stage.h"
#include "plan/job_plan.h"
#include "transport/transport.h"

namespace trainyard {

// Pins plan->spec.inference.checkpoint_step: the newest checkpoint in
// inference.checkpoint_dir that verifies when it is 0 (nothing in the folder
// is moved or changed), else that step, verified. Nothing to do for a model
// from model.init.safetensors. Errors name inference.checkpoint_dir and what
// is wrong (no checkpoint, none verifies, the step's files fail to verify).
absl::Status PinModelCheckpoint(JobPlan* plan);

// What an inference job's output folder records about where it came from:
// the model (checkpoint folder, step and SHA-256 of its manifest, or the
// safetensors file and its SHA-256), the normalized spec, and the job's
// identity (a digest of the spec without what does not change a row's
// outputs: the job's name, stage and replica counts, schedule, split and
// recovery). `plan` must be pinned (PinModelCheckpoint).
absl::StatusOr<OutputJob> OutputJobOf(const JobPlan& plan);

// Shard k's rows [first, second) for `rows` rows.
std::pair<int64_t, int64_t> ShardRange(const JobPlan& plan, int64_t rows,
                                       int64_t shard);

// Stage start-up: the stage's data (the job's rows), stage `index` of
// `plan` (pinned), and its model.
absl::StatusOr<std::unique_ptr<Stage>> StartForwardStage(
    const JobPlan& plan, int index, Transport* transport,
    const StageOptions& options);

// What an inference job's output folder holds: its complete shards over
// every replica, and their rows.
struct OutputProgress {
  int64_t rows_done = 0;
  int64_t shards_done = 0;
  int64_t rows_total = 0;
  int64_t shards_total = 0;
};
absl::StatusOr<OutputProgress> CountOutputs(const JobPlan& plan);

// After a replica's last stage wrote its shards: when every replica's are
// written, finishes the folder (OutputShards::Finish, the manifest);
// otherwise leaves that to the replica that writes the last one (each
// writes its shards before counting, so the last to count sees them all).
absl::Status FinishWhenComplete(const JobPlan& plan, OutputShards* outputs);

struct ForwardRunOptions {
  int replica = 0;  // of plan.num_replicas()
  // The pipeline's transport (null with one stage): the stages check they
  // loaded the same checkpoint before the first row.
  Transport* transport = nullptr;
  absl::Duration timeout = absl::Minutes(2);
  // Checked before every batch; when set, the run returns Cancelled.
  const std::atomic<bool>* cancel = nullptr;
  // The last stage of an inference job: the output folder it writes its
  // replica's shards into (opened by the caller, shared by the replicas of
  // one process). Not owned.
  OutputShards* outputs = nullptr;
  // On the last stage, after each shard this replica wrote: the shard, its
  // rows and the seconds since the previous call (or the start).
  std::function<void(int64_t shard, int64_t rows, double seconds)> on_shard;
  // On the last stage of the last replica of an eval job (the one that
  // runs it), with the model's step.
  std::function<void(int64_t step, const EvalReport&)> on_eval;
};

// Runs the job's forward work for `stage` (started by StartForwardStage) on
// the calling thread, then tells the task the job ended and finalizes it.
absl::Status RunForwardStage(Stage& stage, const JobPlan& plan,
                             const ForwardRunOptions& options);

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_FORWARD_JOB_H_
