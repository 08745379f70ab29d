#include "controller/job_manager.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/adoption.h"
#include "controller/gang_start.h"
#include "controller/job_api.h"
#include "controller/job_records.h"
#include "controller/job_store.h"
#include "controller/job_telemetry.h"
#include "controller/liveness.h"
#include "controller/manager_state.h"
#include "controller/recovery.h"
#include "controller/stage_reports.h"
#include "controller/worker_registry.h"
#include "core/status_macros.h"

namespace trainyard {

// The manager's parts, each built on those above it.
struct JobManager::Parts {
  Parts(const JobManagerOptions& options, std::unique_ptr<JobStore> store)
      : state(options, std::move(store)),
        telemetry(state),
        records(state, telemetry),
        gangs(state, records, telemetry),
        recovery(state, records, gangs),
        adoption(state, records, gangs),
        liveness(state, gangs, recovery),
        reports(state, records, telemetry, gangs, recovery),
        workers(state, telemetry, gangs, adoption, liveness, reports),
        jobs(state, records, telemetry, gangs) {}

  ManagerState state;
  JobTelemetry telemetry;
  JobRecords records;
  GangStarter gangs;
  Recovery recovery;
  Adoption adoption;
  Liveness liveness;
  StageReports reports;
  WorkerRegistry workers;
  JobApi jobs;
};

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(
    const JobManagerOptions& options) {
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_timeout (", absl::FormatDuration(options.heartbeat_timeout),
        ") must be greater than heartbeat_interval (",
        absl::FormatDuration(options.heartbeat_interval), ") > 0"));
  }
  if (options.events_in_memory < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "events_in_memory must be at least 1, got ", options.events_in_memory));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store,
                   JobStore::Open(options.data_dir));
  std::unique_ptr<JobManager> manager(
      new JobManager(std::make_unique<Parts>(options, std::move(store))));
  RETURN_IF_ERROR(manager->parts_->adoption.LoadJobs());
  manager->parts_->liveness.Start();
  return manager;
}

JobManager::JobManager(std::unique_ptr<Parts> parts)
    : parts_(std::move(parts)) {}

JobManager::~JobManager() { Shutdown(); }

void JobManager::Shutdown() {
  ManagerState& s = parts_->state;
  {
    absl::MutexLock lock(&s.mu);
    if (s.shutting_down) return;
    s.shutting_down = true;
    for (auto& [id, w] : s.workers) {
      s.outbox.CloseLocked(w.link,
                           absl::UnavailableError("controller shutting down"));
    }
    s.workers.clear();
  }
  parts_->liveness.Join();
  s.outbox.Deliver();
}

absl::StatusOr<v1::Job> JobManager::SubmitJob(
    const v1::SubmitJobRequest& request, const Caller& caller) {
  return parts_->jobs.SubmitJob(request, caller);
}

absl::StatusOr<v1::Job> JobManager::GetJob(const std::string& job_id,
                                           const Caller& caller) {
  return parts_->jobs.GetJob(job_id, caller);
}

absl::StatusOr<v1::ListJobsResponse> JobManager::ListJobs(
    const v1::ListJobsRequest& request, const Caller& caller) {
  return parts_->jobs.ListJobs(request, caller);
}

absl::StatusOr<v1::Job> JobManager::CancelJob(
    const v1::CancelJobRequest& request, const Caller& caller) {
  return parts_->jobs.CancelJob(request, caller);
}

absl::StatusOr<std::shared_ptr<JobEventLog>> JobManager::WatchJob(
    const std::string& job_id, const Caller& caller) {
  return parts_->jobs.WatchJob(job_id, caller);
}

absl::StatusOr<v1::GetTraceResponse> JobManager::GetTrace(
    const v1::GetTraceRequest& request, const Caller& caller) {
  return parts_->jobs.GetTrace(request, caller);
}

absl::StatusOr<std::shared_ptr<LogRing>> JobManager::WatchLogs(
    const std::string& job_id, const Caller& caller) {
  return parts_->jobs.WatchLogs(job_id, caller);
}

absl::StatusOr<std::string> JobManager::RegisterWorker(
    const v1::RegisterWorker& reg, std::shared_ptr<WorkerLink> link) {
  return parts_->workers.RegisterWorker(reg, std::move(link));
}

void JobManager::OnWorkerMessage(const std::string& worker_id,
                                 const v1::WorkerMessage& msg,
                                 const WorkerLink* link) {
  parts_->workers.OnWorkerMessage(worker_id, msg, link);
}

void JobManager::OnWorkerStreamEnded(const std::string& worker_id,
                                     const std::string& why,
                                     const WorkerLink* link) {
  parts_->workers.OnWorkerStreamEnded(worker_id, why, link);
}

std::vector<WorkerInfo> JobManager::ListWorkers() {
  return parts_->workers.ListWorkers();
}

ControllerStats JobManager::GetStats() {
  absl::MutexLock lock(&parts_->state.mu);
  return parts_->telemetry.StatsLocked();
}

void JobManager::StallForTesting(absl::Duration d) {
  absl::MutexLock lock(&parts_->state.mu);
  absl::SleepFor(d);
}

}  // namespace trainyard
