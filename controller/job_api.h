// JobApi: the JobService calls on jobs: submit, get, list, cancel, and
// the streams and traces that watch them. A job belongs to the user who
// submitted it; a non-admin caller sees and cancels only their own jobs
// (PermissionDenied naming the job otherwise, with nothing changed) and
// lists only their own. Errors are absl codes (JobManager documents each
// call's).
//
// Thread safety: every method takes the manager's lock, and delivers what
// it queued to the workers after releasing it.
#ifndef TRAINYARD_CONTROLLER_JOB_API_H_
#define TRAINYARD_CONTROLLER_JOB_API_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "controller/gang_start.h"
#include "controller/job_entry.h"
#include "controller/job_event_log.h"
#include "controller/job_records.h"
#include "controller/job_telemetry.h"
#include "controller/log_ring.h"
#include "controller/manager_state.h"
#include "plan/job_plan.h"
#include "proto/trainyard.pb.h"
#include "security/tokens.h"

namespace trainyard {

class JobApi {
 public:
  JobApi(ManagerState& state, JobRecords& records, JobTelemetry& telemetry,
         GangStarter& gangs)
      : s_(state), records_(records), telemetry_(telemetry), gangs_(gangs) {}
  JobApi(const JobApi&) = delete;
  JobApi& operator=(const JobApi&) = delete;

  // JobManager's calls of the same names.
  absl::StatusOr<v1::Job> SubmitJob(const v1::SubmitJobRequest& request,
                                    const Caller& caller)
      ABSL_LOCKS_EXCLUDED(s_.mu);
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id,
                                 const Caller& caller)
      ABSL_LOCKS_EXCLUDED(s_.mu);
  absl::StatusOr<v1::ListJobsResponse> ListJobs(
      const v1::ListJobsRequest& request, const Caller& caller)
      ABSL_LOCKS_EXCLUDED(s_.mu);
  absl::StatusOr<v1::Job> CancelJob(const v1::CancelJobRequest& request,
                                    const Caller& caller)
      ABSL_LOCKS_EXCLUDED(s_.mu);
  absl::StatusOr<std::shared_ptr<JobEventLog>> WatchJob(
      const std::string& job_id, const Caller& caller)
      ABSL_LOCKS_EXCLUDED(s_.mu);
  absl::StatusOr<v1::GetTraceResponse> GetTrace(
      const v1::GetTraceRequest& request, const Caller& caller)
      ABSL_LOCKS_EXCLUDED(s_.mu);
  absl::StatusOr<std::shared_ptr<LogRing>> WatchLogs(const std::string& job_id,
                                                     const Caller& caller)
      ABSL_LOCKS_EXCLUDED(s_.mu);

 private:
  // The job already submitted under `key` (RequestKey), or null.
  const JobEntry* FindRequestLocked(const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Stores a new job of `request` (planned as `plan`) under `key`, queues
  // it and schedules; the job as it is then.
  absl::StatusOr<v1::Job> AddJobLocked(const v1::SubmitJobRequest& request,
                                       const std::string& key,
                                       const Caller& caller,
                                       const JobPlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // The job, if `caller` may `verb` ("see", "cancel", "watch") it:
  // NotFound, or PermissionDenied for another user's job.
  absl::StatusOr<JobEntry*> FindJobLocked(const std::string& job_id,
                                          const Caller& caller,
                                          const char* verb)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  ManagerState& s_;
  JobRecords& records_;
  JobTelemetry& telemetry_;
  GangStarter& gangs_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_JOB_API_H_
