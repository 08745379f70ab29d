// The per-stage job loop shared by `trainyard train` (stages as threads) and
// the worker daemon (one stage per process): load the stage's data, resume
// or initialise, then run steps, evals and checkpoints until the job ends,
// is stopped, or fails.
//
// Thread safety: RunStage runs on the calling thread; the callbacks are
// called from it. `cancel` may be set from any thread.
#ifndef TRAINYARD_ENGINE_STAGE_RUNNER_H_
#define TRAINYARD_ENGINE_STAGE_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/stage.h"
#include "plan/job_plan.h"
#include "transport/transport.h"

namespace trainyard {

// Rows of the eval set, known to every stage from the plan alone (reads at
// most .npy headers). For an infer or eval job, its rows: data.eval, the
// held-out tail of data.train, else all of data.train.
absl::StatusOr<int64_t> EvalRows(const JobPlan& plan);

// The data stage `stage` needs: the first stage loads the train (and eval)
// rows, or, for an infer or eval job, only its rows (as the eval set);
// every stage gets the eval row count.
absl::StatusOr<StageData> LoadStageData(const JobPlan& plan, int stage);

// The completed-step count to resume from: 0 for a fresh start, or the
// newest checkpoint that verifies when checkpoint.resume is "latest" (newer
// ones that fail verification are set aside, never deleted: see
// LatestVerifiedCheckpoint; each is logged and, when `set_aside` is given,
// described there). Checkpoints after `max_step` (>= 0) are not taken: a
// restarted job must not skip steps its controller has not published.
// FailedPrecondition if checkpoint.dir holds checkpoints and resume is not
// "latest" (nothing is overwritten), or if none verifies.
absl::StatusOr<int64_t> ResumeStep(
    const JobPlan& plan, std::vector<std::string>* set_aside = nullptr,
    int64_t max_step = -1);

// Checkpoint manifest metadata: the step, stage count and normalized spec.
std::string PlanMetadataJson(const JobPlan& plan, int64_t step);

// A stage's state after a step, serialized (Stage::CheckpointContents
// through SerializeSafetensorsToTensor) into one host uint8 tensor: an
// in-memory snapshot (JobSpec.recovery.snapshot_every). Its storage is
// shared, never written after it is made: held by the worker daemon and
// handed to transports without copies.
struct StageSnapshot {
  int stage = 0;
  int64_t step = 0;
  Tensor bytes;
};

// Before the first step of a restart from snapshots: the rank in
// `sources[k]` holds stage k's snapshot after `step` (`held(k)`, an
// undefined tensor if it does not) and sends it to rank k over `transport`,
// in stage order; every
// rank returns its own stage's snapshot. Every rank of the gang calls this.
// Aborted when a snapshot is missing on its holder (the job's next restart
// then uses its checkpoints).
absl::StatusOr<StageSnapshot> DistributeSnapshots(
    Transport* transport, int rank, int64_t step,
    const std::vector<int>& sources,
    const std::function<Tensor(int stage)>& held, absl::Duration timeout);

// A stage ready to run: built, and initialised or restored.
struct StartedStage {
  std::unique_ptr<Stage> stage;
  int64_t resume_step = 0;  // 0: freshly initialised
  // Checkpoints found bad and set aside on the way (see ResumeStep).
  std::vector<std::string> set_aside;
};

// Stage start-up, the same for `trainyard train` and the worker daemon:
// loads the stage's data, builds stage `index` of `plan`, then restores
// `snapshot` when given, else the newest checkpoint (checkpoint.resume
// "latest"), else initialises the parameters.
// `max_resume_step` (>= 0) bounds the checkpoint taken (ResumeStep).
absl::StatusOr<StartedStage> StartStage(const JobPlan& plan, int index,
                                        Transport* transport,
                                        const StageOptions& options,
                                        const StageSnapshot* snapshot = nullptr,
                                        int64_t max_resume_step = -1);

struct StageRunOptions {
  // Stop (successfully) once this many steps are complete; 0 = spec.steps.
  int64_t stop_after_step = 0;
  absl::Duration timeout = absl::Minutes(2);
  // Checked before every step; when set, RunStage returns Cancelled.
  const std::atomic<bool>* cancel = nullptr;
  // Per step, on every stage, with the step's wall time.
  std::function<void(const StepReport&, double step_seconds)> on_step;
  // Per eval pass, on every stage (metrics only on the last).
  std::function<void(int64_t step, const EvalReport&)> on_eval;
  // On the first stage, after a checkpoint is committed; called from the
  // stage's thread or its checkpoint writer's thread (checkpoints are
  // written in the background), one call at a time.
  std::function<void(int64_t step, const std::string& dir)> on_checkpoint;
  // In-memory snapshots: every this many steps (0 = never; never after the
  // last step) the stage serializes its state (one copy), gives it to
  // on_snapshot and sends it to a neighbour (stage k to k + 1, the last
  // stage to the one before it), which takes it in with its next message
  // from this stage and gives it to its own on_snapshot: nobody waits for
  // a snapshot. Every stage of the job must use the same value.
  int64_t snapshot_every = 0;
  std::function<void(StageSnapshot)> on_snapshot;
  // Asked before a checkpoint is committed (and pruned); false skips that
  // commit (the files stay uncommitted). The worker daemon says false while
  // it is cut off from the controller, which may have given the job to
  // other workers that now read the checkpoint folder.
  std::function<bool()> may_commit;
  // After this stage's checkpoint file is written, with the seconds it
  // took (serialise, write, fsync); from the writer's thread.
  std::function<void(double seconds)> on_checkpoint_file;
  // False for every data-parallel replica but the first: replicas hold the
  // same state, so one writes the checkpoints (all read them to resume).
  // Every stage of a replica must use the same value.
  bool write_checkpoints = true;
};

// Every stage chose its resume point (or an infer or eval job its model's
// checkpoint) on its own: makes sure the pipeline's stages agree before
// the first step (one small all-reduce over `transport`; nothing with one
// stage). Aborted when they do not: a restart settles it.
absl::Status CheckResumedTogether(Stage& stage, Transport* transport,
                                  int num_stages, absl::Duration timeout);

// Runs `stage` (already initialised or restored) through the rest of the
// job, on the calling thread (which it binds to the stage's device). Errors are
// returned as they are; the caller aborts the transport so the other stages
// stop too.
absl::Status RunStage(Stage& stage, Transport* transport, const JobPlan& plan,
                      const StageRunOptions& options);

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_STAGE_RUNNER_H_
