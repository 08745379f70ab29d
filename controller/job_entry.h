// The JobManager's records of one job (JobEntry) and of one connected
// worker (WorkerEntry), with the labels its messages name them by.
//
// A gang of S stages and R replicas runs on S x R workers, one per rank
// (rank = replica * S + stage, plan/job_plan.h Gang); the per-rank vectors
// below are indexed by rank.
//
// Thread safety: plain data; the JobManager guards every entry with its
// lock.
#ifndef TRAINYARD_CONTROLLER_JOB_ENTRY_H_
#define TRAINYARD_CONTROLLER_JOB_ENTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "controller/job_event_log.h"
#include "controller/log_ring.h"
#include "controller/trace_buffer.h"
#include "controller/worker_outbox.h"
#include "observability/tensorboard_writer.h"
#include "plan/job_plan.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

// How a rank of the running gang has ended so far.
enum class RankEnd { kRunning, kSucceeded, kFailed };

struct JobEntry {
  v1::Job job;
  int64_t submit_order = 0;  // 1, 2, ... in order of submission
  Gang gang;
  // The rank whose step and eval reports the job publishes: the stage
  // holding the loss (S - 1; 0 under "zbv") of the last replica.
  int loss_rank = 0;
  // The spec sent in StageAssignment (WorkerSpec of the plan's spec).
  v1::JobSpec worker_spec;
  std::shared_ptr<JobEventLog> event_log;  // null until first needed
  int64_t next_seq = 0;                    // store sequence of the next event

  // ---- The running gang.
  // step -> timings of the ranks that reported it so far.
  std::map<int64_t, std::vector<v1::StageTiming>> pending_steps;
  std::vector<RankEnd> rank_ends;
  std::string first_cancel_error;
  // A rank failed; the job fails with this reason at failure_deadline
  // (or when every rank has reported), unless a worker of the job is
  // found lost first: a neighbour's "connection closed" is a symptom, the
  // lost worker the cause, and the reason should name the cause.
  std::string pending_failure;
  absl::Time failure_deadline = absl::InfiniteFuture();
  // Whether pending_failure may be cured by a restart.
  bool pending_recoverable = true;
  // Per rank: its StageTransport was recorded (one per rank, so a worker
  // cannot grow the history), and the notes recorded so far.
  std::vector<bool> transport_reported;
  std::set<std::string> notes;

  // ---- Recovery (worker_spec.recovery).
  int max_restarts = 0;
  int64_t backoff_ms = 0;
  // While RECOVERING: old-gang workers whose ranks have not reported
  // their end yet (each was cancelled; a lost one is dropped).
  std::set<std::string> draining_workers;
  absl::Time restart_not_before = absl::InfinitePast();
  // A draining rank that has not stopped by then is given up on: its
  // worker is declared lost (JobManagerOptions::drain_timeout).
  absl::Time drain_deadline = absl::InfiniteFuture();
  absl::Time loss_detected = absl::InfinitePast();
  int64_t loss_detected_step = 0;  // steps_completed when it was detected
  absl::Time gang_assigned = absl::InfinitePast();  // the new gang's ranks
  // Per rank of the current gang: its StageStarted resume step, or -1.
  std::vector<int64_t> resume_steps;
  bool recovery_reported = true;  // the JobRecovery event is recorded
  absl::Time gang_restored = absl::InfiniteFuture();  // every rank started
  // The new gang's first step (or end) was reported before every rank's
  // StageStarted had arrived (they come on different streams).
  bool progressed_early = false;

  // ---- An inference job's progress (StageShardReport): this run's
  // first report, and the rows done then, for its rate.
  int progress_run = -1;  // job.restarts() of the run that set them
  absl::Time progress_since = absl::InfinitePast();
  int64_t progress_rows_at_start = 0;

  // ---- State to resume from (StateHeld reports).
  // step -> per rank, the workers holding that rank's snapshot.
  std::map<int64_t, std::vector<std::set<std::string>>> snapshot_holders;
  int64_t newest_checkpoint = 0;  // committed, as rank 0 reported
  // The current gang resumed from snapshots; a gang that breaks before
  // every rank restored turns snapshots off for the job's later restarts.
  bool from_snapshot = false;
  bool snapshots_failed = false;

  // ---- Telemetry.
  // The job's TensorBoard event file, opened at its first published step
  // or eval, closed when it ends; `tensorboard_failed` after an error (the
  // job goes on; the error is logged once).
  std::unique_ptr<TensorboardWriter> tensorboard;
  bool tensorboard_failed = false;
  // In memory only; null until first needed, and again once the job is
  // among the ended jobs no longer kept (JobManagerOptions).
  std::unique_ptr<TraceBuffer> traces;
  std::shared_ptr<LogRing> log_ring;

  // ---- Re-adoption after a controller restart.
  bool adopting = false;
  absl::Time adopt_deadline = absl::InfiniteFuture();
  std::vector<bool> claimed;  // per rank
};

struct WorkerEntry {
  std::string id;
  std::string name;
  v1::WorkerCapabilities caps;
  int64_t register_order = 0;  // the number in its id
  std::shared_ptr<WorkerLink> link;
  absl::Time last_seen;
  std::string job_id;  // empty = idle
  int rank = -1;       // of job_id's gang
  // The job this worker was last assigned: only that job's snapshots
  // may still be in its memory.
  std::string last_job;
  // A stage this worker still runs although the controller no longer
  // counts it in any gang (a refused claim after a reconnect): the worker
  // gets no new stage until it reports that one's end.
  std::string stale_job;
  // Said it is shutting down (Heartbeat.draining): never scheduled again.
  bool shutting_down = false;
  // Log line rate limit (token bucket), and lines dropped by it since the
  // last one taken.
  double log_tokens = 0;
  absl::Time log_refilled = absl::InfinitePast();
  int64_t logs_dropped = 0;
};

// The spec to hand workers: `plan_spec` (PlanJob's normalized spec) with
// every file path the submitter wrote relative put back as written, so each
// worker resolves it against its own --data_dir.
v1::JobSpec WorkerSpec(const v1::JobSpec& submitted,
                       const v1::JobSpec& plan_spec);

// Sets e's gang, loss rank, worker spec and recovery settings from its
// plan.
void SetPlan(JobEntry& e, const JobPlan& plan);

// "stage 3", or with replicas "rank 3 (stage 1 of replica 1)".
std::string RankLabel(int rank, const Gang& gang);
// "w-3 (gpu-node-1)".
std::string WorkerLabel(const WorkerEntry& w);
// "restart 2 of 3".
std::string RestartLabel(const JobEntry& e);

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_JOB_ENTRY_H_
