// JobManager: the controller's brain, free of gRPC, and the one entry
// point the RPC layer calls. It owns the JobStore, every job's lifecycle
// (QUEUED -> RUNNING -> SUCCEEDED | FAILED | CANCELLED, with RUNNING ->
// RECOVERING -> RUNNING for each automatic restart), the registry of
// connected workers, gang scheduling, the per-job event logs WatchJob
// reads, and the liveness checker thread that declares silent workers
// lost.
//
// Its parts, each in a file of its own (ManagerState, controller/
// manager_state.h, is what they share):
//   controller/job_api.h          submit, get, list, cancel, watch
//   controller/worker_registry.h  workers, their messages, rendezvous
//   controller/gang_start.h       placing and starting gangs
//   controller/stage_reports.h    what workers report of their ranks
//   controller/recovery.h         restarts of broken gangs
//   controller/adoption.h         jobs a previous controller left
//   controller/liveness.h         heartbeats and deadlines
//   controller/job_records.h      job state and history, persisted
//   controller/job_telemetry.h    traces, log lines, TensorBoard, stats
//
// Workers are reached through WorkerLink (controller/worker_outbox.h).
// Messages to workers are queued while the manager's lock is held and
// delivered, in order, after it is released, so a link may call back into
// the manager from Send or Close.
//
// Ownership: owns the store and the liveness thread; holds shared_ptrs to
// worker links and event logs. Destroying the manager calls Shutdown().
// Thread safety: every public method is thread-safe.
#ifndef TRAINYARD_CONTROLLER_JOB_MANAGER_H_
#define TRAINYARD_CONTROLLER_JOB_MANAGER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/job_event_log.h"
#include "controller/job_manager_options.h"
#include "controller/log_ring.h"
#include "controller/manager_status.h"
#include "controller/worker_outbox.h"
#include "proto/trainyard.pb.h"
#include "security/tokens.h"

namespace trainyard {

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
  // (a RUNNING job is adopted, or restarted, by the next process). Idempotent.
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
  // Registered workers in registration order.
  std::vector<WorkerInfo> ListWorkers();

  // What the controller's /metrics reports (read at each scrape).
  ControllerStats GetStats();

  // Holds the manager's lock for `d`, as a disk write that stalls would:
  // nothing the workers send is read meanwhile. For tests of liveness.
  void StallForTesting(absl::Duration d);

 private:
  struct Parts;  // controller/job_manager.cc

  explicit JobManager(std::unique_ptr<Parts> parts);

  const std::unique_ptr<Parts> parts_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_JOB_MANAGER_H_
