// JobManager: the controller's brain, free of gRPC. It owns the JobStore,
// every job's lifecycle (QUEUED -> RUNNING -> SUCCEEDED | FAILED |
// CANCELLED, with RUNNING -> RECOVERING -> RUNNING for each automatic
// restart), the registry of connected workers, gang scheduling
// (controller/scheduler.h), the per-job event logs WatchJob reads, and the
// liveness checker thread that declares silent workers lost.
//
// Recovery (JobSpec.recovery, docs/CONTROLLER.md): when a worker of a
// running job is lost, or a stage fails for a reason a restart may cure,
// the job goes RECOVERING: the rest of its gang is cancelled and drained
// (each stage reports its end or its worker is lost), then, after the
// restart's backoff, the job is scheduled again like a queued one and every
// stage resumes from the newest checkpoint that verifies. Past
// max_restarts the job fails with every restart's reason.
//
// A restarted controller loses no running job: it loads RUNNING jobs from
// the store and waits (adopt_timeout) for their workers to reconnect and
// claim their stages (RegisterWorker.running); a job whose stages are all
// claimed runs on as if nothing happened, one that is not is restarted.
//
// It also serves the rendezvous of running jobs (controller/rendezvous_table.h)
// to the workers running their stages, and records the transport each job's
// stages chose as a JobNote in the job's history.
//
// Observability, in memory only: the span traces of each job's newest steps
// (controller/trace_buffer.h, for GetTrace) and each job's newest log lines
// from its workers (controller/log_ring.h, for WatchLogs). Both are kept
// for jobs that have not ended and for the `keep_ended_jobs` jobs that
// ended last.
//
// Workers are reached through WorkerLink (the gRPC layer implements it over
// the Connect stream; tests may fake it). Messages to workers are queued
// while the manager's lock is held and delivered, in order, after it is
// released, so a link may call back into the manager from Send or Close.
//
// Ownership: owns the store and the liveness thread; holds shared_ptrs to
// worker links and event logs. Destroying the manager calls Shutdown().
// Thread safety: every public method is thread-safe.
#ifndef TRAINYARD_CONTROLLER_JOB_MANAGER_H_
#define TRAINYARD_CONTROLLER_JOB_MANAGER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/job_event_log.h"
#include "controller/job_store.h"
#include "controller/log_ring.h"
#include "controller/rendezvous_table.h"
#include "observability/tensorboard_writer.h"
#include "controller/trace_buffer.h"
#include "plan/job_plan.h"
#include "proto/trainyard.pb.h"
#include "security/tokens.h"

namespace trainyard {

// The controller's end of one worker's stream.
class WorkerLink {
 public:
  virtual ~WorkerLink() = default;
  // Queues `msg` to the worker; never blocks. Ignored after Close.
  virtual void Send(const v1::ControllerMessage& msg) = 0;
  // Ends the stream with `status`; idempotent.
  virtual void Close(const absl::Status& status) = 0;
};

struct JobManagerOptions {
  std::string data_dir;  // required
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // Bounds on what workers may store in a job's rendezvous.
  RendezvousLimits rendezvous_limits;
  // After a restart, how long a RUNNING job waits for its workers to
  // reconnect and claim their stages before it is restarted instead.
  absl::Duration adopt_timeout = absl::Seconds(10);
  // How long a restarting job waits for a cancelled stage of its old gang
  // to stop before it drops that stage's worker (declared lost).
  absl::Duration drain_timeout = absl::Seconds(10);
  // The workers' data folder (their --data_dir) as paths in specs name it;
  // when set, SubmitJob refuses a spec with a path that leaves it
  // (PlanOptions::confine_to), before any worker sees the spec.
  std::string job_data_dir;
  // Where the workers' task plugins are (the same lib<name>.so files):
  // when set, SubmitJob also asks the plugin to check task.config
  // (validate_config, which opens no files), so a bad config is refused at
  // submit rather than when the job starts. Runs the plugins' code in the
  // controller: point it only at trusted plugins. Empty = the workers check.
  std::string plugin_dir;
  // Per job: step traces and log lines kept in memory.
  TraceLimits trace_limits;
  LogRingLimits log_limits;
  // Log lines taken from one worker: a token bucket of this rate and
  // burst; lines beyond it are dropped and counted (a notice line says so
  // with the worker's next line taken).
  double log_lines_per_second = 200;
  double log_burst = 1000;
  // Ended jobs whose traces and log lines are still kept (the newest
  // ended); older ones' are dropped.
  int keep_ended_jobs = 16;
};

// Whether a stage that failed with `code` may succeed when the job is
// restarted: not for errors in the spec, its files or the checkpoint
// folder (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, ...), which
// would fail again.
bool IsRecoverableStageFailure(absl::StatusCode code);

class JobManager {
 public:
  // Opens the store (recovering jobs a previous process left RUNNING),
  // loads every job and starts the liveness thread.
  static absl::StatusOr<std::unique_ptr<JobManager>> Create(
      const JobManagerOptions& options);
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Stops the liveness thread and closes every worker link (UNAVAILABLE).
  // Afterwards worker traffic is ignored and job states no longer change
  // (a RUNNING job is failed by the next process's recovery). Idempotent.
  void Shutdown();

  // ---- JobService. Errors are absl codes; the RPC layer maps them.
  // `caller` is who asks (the RPC layer authenticates them): a job belongs
  // to the user who submitted it; a non-admin caller sees and cancels only
  // their own jobs (PermissionDenied naming the job otherwise, with nothing
  // changed) and lists only their own. The default caller is an anonymous
  // admin (a controller run with --insecure, and in-process tests).
  //
  // InvalidArgument: missing request_id, or a spec PlanJob rejects (the
  // message lists every field path). A request_id the caller used before
  // returns that job.
  absl::StatusOr<v1::Job> SubmitJob(const v1::SubmitJobRequest& request,
                                    const Caller& caller = Caller{"", true});
  // NotFound naming the id.
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id,
                                 const Caller& caller = Caller{"", true});
  // InvalidArgument for a negative page_size or a malformed page_token.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(
      const v1::ListJobsRequest& request,
      const Caller& caller = Caller{"", true});
  // NotFound; FailedPrecondition naming the state of a finished job.
  absl::StatusOr<v1::Job> CancelJob(const v1::CancelJobRequest& request,
                                    const Caller& caller = Caller{"", true});
  // The job's event log (loaded from the store on first use). NotFound.
  absl::StatusOr<std::shared_ptr<JobEventLog>> WatchJob(
      const std::string& job_id, const Caller& caller = Caller{"", true});
  // Every stage's spans of step `request.step()` (0: the newest step all
  // stages have reported). NotFound naming the job, or the step and the
  // steps held; PermissionDenied as GetJob; InvalidArgument for a
  // negative step.
  absl::StatusOr<v1::GetTraceResponse> GetTrace(
      const v1::GetTraceRequest& request,
      const Caller& caller = Caller{"", true});
  // The job's log ring, for WatchLogs (closed once the job has ended).
  // NotFound for an unknown job, or an ended job whose lines are no longer
  // kept (older than the last `keep_ended_jobs` ended, or ended before
  // this controller started); PermissionDenied as WatchJob.
  absl::StatusOr<std::shared_ptr<LogRing>> WatchLogs(
      const std::string& job_id, const Caller& caller = Caller{"", true});

  // ---- WorkerService.
  // Registers a worker and sends it WorkerRegistered through `link`;
  // returns the new worker id ("w-<n>"). Unavailable after Shutdown.
  absl::StatusOr<std::string> RegisterWorker(const v1::RegisterWorker& reg,
                                             std::shared_ptr<WorkerLink> link);
  // Any message from a registered worker (counts as a heartbeat).
  // RendezvousPut / RendezvousGet are answered (RendezvousReply, now or
  // when the key appears, times out, or the job ends) only for a worker
  // that runs a stage of that RUNNING job: NotFound for an unknown job,
  // FailedPrecondition otherwise. `link`, when given, must be the link the
  // worker registered with: ids are reused by reconnecting workers, and a
  // late call from an old stream must not touch the new registration.
  void OnWorkerMessage(const std::string& worker_id,
                       const v1::WorkerMessage& msg,
                       const WorkerLink* link = nullptr);
  // The worker's stream ended (`why` says how); the worker is lost at once.
  void OnWorkerStreamEnded(const std::string& worker_id, const std::string& why,
                           const WorkerLink* link = nullptr);

  struct WorkerInfo {
    std::string id;
    std::string name;
    std::string device;
    std::string job_id;  // empty = idle
    int stage = -1;
    v1::WorkerCapabilities caps;
    absl::Duration since_heartbeat;
  };
  // Registered workers in registration order.
  std::vector<WorkerInfo> ListWorkers();

  // What the controller's /metrics reports (read at each scrape).
  struct Stats {
    std::map<v1::JobState, int64_t> jobs;  // every state, 0s included
    int64_t queued = 0;  // waiting to be scheduled (QUEUED and restarting)
    // (device, "idle" | "busy") -> workers.
    std::map<std::pair<std::string, std::string>, int64_t> workers;
    int64_t restarts = 0;  // automatic restarts, over every job
  };
  Stats GetStats();

 private:
  struct JobEntry {
    v1::Job job;
    int64_t order = 0;
    // Ranks of the gang: stages x replicas (rank = replica * S + stage).
    int num_stages = 1;
    int replicas = 1;
    // The rank whose step and eval reports the job publishes: the stage
    // holding the loss (S - 1; 0 under "zbv") of the last replica.
    int loss_rank = 0;
    v1::JobSpec normalized;            // sent in StageAssignment
    std::shared_ptr<JobEventLog> log;  // null until first needed
    int64_t next_seq = 0;              // store sequence of the next event
    // step -> timings of the stages that reported it so far.
    std::map<int64_t, std::vector<v1::StageTiming>> pending_steps;
    std::vector<int> stage_done;  // per stage: 0 running, 1 ok, 2 failed
    std::string first_cancel_error;
    // A stage failed; the job fails with this reason at failure_deadline
    // (or when every stage has reported), unless a worker of the job is
    // found lost first: a neighbour's "connection closed" is a symptom, the
    // lost worker the cause, and the reason should name the cause.
    std::string pending_failure;
    absl::Time failure_deadline = absl::InfiniteFuture();
    // Per stage: its StageTransport was recorded (one per stage, so a
    // worker cannot grow the history), and the notes recorded so far.
    std::vector<bool> transport_reported;
    std::set<std::string> notes;
    // Whether pending_failure may be cured by a restart.
    bool pending_recoverable = true;

    // ---- Recovery (normalized JobSpec.recovery).
    int max_restarts = 0;
    int64_t backoff_ms = 0;
    // While RECOVERING: old-gang workers whose stages have not reported
    // their end yet (each was cancelled; a lost one is dropped).
    std::set<std::string> draining;
    absl::Time restart_not_before = absl::InfinitePast();
    // A draining stage that has not stopped by then is given up on: its
    // worker is declared lost (JobManagerOptions::drain_timeout).
    absl::Time drain_deadline = absl::InfiniteFuture();
    absl::Time detected = absl::InfinitePast();  // the loss was noticed
    int64_t detected_step = 0;
    absl::Time assigned = absl::InfinitePast();  // the new gang got its stages
    // Per stage of the current gang: its StageStarted resume step, or -1.
    std::vector<int64_t> resume_steps;
    bool recovery_reported = true;  // the JobRecovery event is recorded
    absl::Time restored = absl::InfiniteFuture();  // every stage started
    // The new gang's first step (or end) was reported before every stage's
    // StageStarted had arrived (they come on different streams).
    bool progressed_early = false;

    // ---- State to resume from (StateHeld reports).
    // step -> per stage, the workers holding that stage's snapshot.
    std::map<int64_t, std::vector<std::set<std::string>>> snapshot_holders;
    int64_t newest_checkpoint = 0;  // committed, as stage 0 reported
    // The current gang resumed from snapshots; a gang that breaks before
    // every stage restored turns snapshots off for the job's later restarts.
    bool from_snapshot = false;
    bool snapshots_failed = false;

    // The job's TensorBoard event file, opened at its first published step
    // or eval, closed when it ends; `tensorboard_failed` after an error (the
    // job goes on; the error is logged once).
    std::unique_ptr<TensorboardWriter> tensorboard;
    bool tensorboard_failed = false;

    // In memory only; null until first needed, and again once the job is
    // among the ended jobs no longer kept (JobManagerOptions).
    std::unique_ptr<TraceBuffer> traces;
    std::shared_ptr<LogRing> logs;

    // ---- Re-adoption after a controller restart.
    bool adopting = false;
    absl::Time adopt_deadline = absl::InfiniteFuture();
    std::vector<bool> claimed;  // per stage
  };
  struct WorkerEntry {
    std::string id;
    std::string name;
    v1::WorkerCapabilities caps;
    int64_t order = 0;
    std::shared_ptr<WorkerLink> link;
    absl::Time last_seen;
    std::string job_id;  // empty = idle
    int stage = -1;
    // The job this worker was last assigned: only that job's snapshots
    // may still be in its memory.
    std::string last_job;
    // A stage this worker still runs although the controller no longer
    // counts it in any gang (a refused claim after a reconnect): the worker
    // gets no new stage until it reports that one's end.
    std::string stale_job;
    // Said it is shutting down (Heartbeat.draining): never scheduled again.
    bool draining = false;
    // Log line rate limit (token bucket), and lines dropped by it since the
    // last one taken.
    double log_tokens = 0;
    absl::Time log_refilled = absl::InfinitePast();
    int64_t logs_dropped = 0;
  };
  struct Outgoing {
    std::shared_ptr<WorkerLink> link;
    bool close = false;
    v1::ControllerMessage msg;
    absl::Status status;
  };

  JobManager(const JobManagerOptions& options, std::unique_ptr<JobStore> store);
  absl::Status Load();
  // Sets e's stage count, worker spec and recovery settings from its plan.
  void SetPlanLocked(JobEntry& e, const JobPlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LivenessLoop();
  // How long a stage failure waits for a lost-worker event to explain it.
  absl::Duration FailureGrace() const;
  // Fails (or restarts) the running jobs whose pending failure's grace has
  // passed, restarts jobs whose adoption timed out, and queues recovering
  // jobs whose backoff has passed.
  void SettleFailuresLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends everything queued in outbox_, in order; safe to re-enter.
  void Deliver() ABSL_LOCKS_EXCLUDED(mu_);

  JobEventLog* LogLocked(JobEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // e's trace buffer and log ring, made on first use; null for an ended
  // job that has none (they are made only while a job may still run).
  TraceBuffer* TracesLocked(JobEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  LogRing* LogRingLocked(JobEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes e's log ring and keeps its telemetry among the ended jobs',
  // dropping the oldest beyond keep_ended_jobs.
  void EndTelemetryLocked(JobEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job, if `caller` may `verb` ("see", "cancel", "watch") it:
  // NotFound, or PermissionDenied for another user's job.
  absl::StatusOr<JobEntry*> FindJobLocked(const std::string& job_id,
                                          const Caller& caller,
                                          const char* verb)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // <data_dir>/tensorboard/<job_id>.
  std::string TensorboardDir(const std::string& job_id) const;
  // Adds a published step or eval to e's event file (opened on first use;
  // after an error, logged once, the job writes no more events).
  void WriteTensorboardLocked(JobEntry& e, const v1::JobEvent& event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Persists e.job plus `event` (when not null) and appends the event.
  void CommitLocked(JobEntry& e, v1::JobEvent* event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetStateLocked(JobEntry& e, v1::JobState state,
                      const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a QUEUED or RUNNING job; detaches its workers, sending CancelStage
  // with `reason` to those still on it when `cancel_workers`.
  void FinishJobLocked(JobEntry& e, v1::JobState state,
                       const std::string& reason, bool cancel_workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartJobLocked(JobEntry& e, const std::vector<std::string>& worker_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LoseWorkerLocked(const std::string& worker_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running gang of `e` is broken by `cause`: restarts the job
  // (BeginRecoveryLocked) when `recoverable` and restarts are left, else
  // fails it with every restart's reason.
  void GangBrokenLocked(JobEntry& e, std::string cause, bool recoverable)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BeginRecoveryLocked(JobEntry& e, std::string cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a RECOVERING job for scheduling once its old gang has drained
  // and its backoff has passed.
  void MaybeRequeueLocked(JobEntry& e, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-attaches a reconnecting worker to the stage it claims, or tells it
  // to stop that stage.
  void ClaimStageLocked(WorkerEntry& w, const v1::StageClaim& claim)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleStartedLocked(WorkerEntry& w, const v1::StageStarted& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the JobRecovery event of e's current restart, whose gang has
  // restored and completed its first step (or ended) at `now`. A first
  // step reported before every StageStarted (other streams) is remembered,
  // and the event is recorded when the last StageStarted arrives.
  void RecordRecoveryLocked(JobEntry& e, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleHeldLocked(WorkerEntry& w, const v1::StateHeld& held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether worker `id` may still hold snapshots of `job_id`.
  bool HoldsSnapshotsOfLocked(const std::string& id, const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For a restart of `e` on `gang` (worker id per stage): the newest step
  // after which every stage's snapshot is held in the gang and which is
  // newer than the newest committed checkpoint, with the rank that sends
  // each stage's; nothing when there is none.
  std::optional<v1::SnapshotResume> ChooseSnapshotLocked(
      const JobEntry& e, const std::vector<std::string>& gang)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a JobNote in e's history.
  void NoteLocked(JobEntry& e, int stage, std::string text)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleStepLocked(WorkerEntry& w, const v1::StageStepReport& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleEvalLocked(WorkerEntry& w, const v1::StageEvalReport& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleDoneLocked(WorkerEntry& w, const v1::StageDone& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleTransportLocked(WorkerEntry& w, const v1::StageTransport& t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleLogLocked(WorkerEntry& w, const v1::StageLogLine& line)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleRendezvousPutLocked(WorkerEntry& w, const v1::RendezvousPut& put)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleRendezvousGetLocked(WorkerEntry& w, const v1::RendezvousGet& get)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when `w` runs a stage of the RUNNING job `job_id`; otherwise why it
  // may not use that job's rendezvous.
  absl::Status CheckRendezvousCallerLocked(const WorkerEntry& w,
                                           const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues each reply to its worker (dropped for a worker gone since).
  void SendRendezvousRepliesLocked(std::vector<RendezvousTable::Reply> replies)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running job `w` works on for (job_id, stage), or null if stale.
  JobEntry* RunningJobOfLocked(const WorkerEntry& w, const std::string& job_id,
                               int stage) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendLocked(const std::shared_ptr<WorkerLink>& link,
                  v1::ControllerMessage msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobManagerOptions options_;
  const std::unique_ptr<JobStore> store_;

  absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<JobEntry>> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> job_by_request_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> queued_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, WorkerEntry> workers_ ABSL_GUARDED_BY(mu_);
  int64_t next_worker_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<Outgoing> outbox_ ABSL_GUARDED_BY(mu_);
  RendezvousTable rendezvous_ ABSL_GUARDED_BY(mu_);
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
  // Ended jobs that still hold traces or log lines, oldest ended first.
  std::deque<std::string> ended_with_telemetry_ ABSL_GUARDED_BY(mu_);

  std::thread liveness_;
};

// The spec to hand workers: `plan_spec` (PlanJob's normalized spec) with
// every file path the submitter wrote relative put back as written, so each
// worker resolves it against its own --data_dir.
v1::JobSpec WorkerSpec(const v1::JobSpec& submitted,
                       const v1::JobSpec& plan_spec);

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_JOB_MANAGER_H_
