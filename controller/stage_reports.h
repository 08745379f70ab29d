// StageReports: what the workers report about the ranks they run. Steps
// and evals are published (the loss rank's metrics, with every rank's
// timings, to the job's history and TensorBoard; every rank's spans to its
// traces); an inference job's written shards are its progress; a rank's
// end finishes the job, or breaks its gang (restart or
// failure, controller/recovery.h); the transport each rank chose is noted
// in the history; StageStarted and StateHeld tell a restarted gang's
// progress and where state to resume from is held.
//
// Reports about a rank the controller no longer counts the worker in are
// dropped.
//
// Thread safety: every method needs the manager's lock.
#ifndef TRAINYARD_CONTROLLER_STAGE_REPORTS_H_
#define TRAINYARD_CONTROLLER_STAGE_REPORTS_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "controller/gang_start.h"
#include "controller/job_entry.h"
#include "controller/job_records.h"
#include "controller/job_telemetry.h"
#include "controller/manager_state.h"
#include "controller/recovery.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

// Whether a stage that failed with `code` may succeed when the job is
// restarted: not for errors in the spec, its files or the checkpoint
// folder (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, ...), which
// would fail again.
bool IsRecoverableStageFailure(absl::StatusCode code);

class StageReports {
 public:
  StageReports(ManagerState& state, JobRecords& records,
               JobTelemetry& telemetry, GangStarter& gangs, Recovery& recovery)
      : s_(state),
        records_(records),
        telemetry_(telemetry),
        gangs_(gangs),
        recovery_(recovery) {}
  StageReports(const StageReports&) = delete;
  StageReports& operator=(const StageReports&) = delete;

  void HandleStepLocked(WorkerEntry& w, const v1::StageStepReport& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  void HandleEvalLocked(WorkerEntry& w, const v1::StageEvalReport& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  void HandleDoneLocked(WorkerEntry& w, const v1::StageDone& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  void HandleTransportLocked(WorkerEntry& w, const v1::StageTransport& t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  void HandleStartedLocked(WorkerEntry& w, const v1::StageStarted& started)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  void HandleHeldLocked(WorkerEntry& w, const v1::StateHeld& held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // An inference job's output folder grew (or its run started): the job's
  // progress, its rate over this run and the time left, published when the
  // rows done grew.
  void HandleShardLocked(WorkerEntry& w, const v1::StageShardReport& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

 private:
  // The running job `w` works on for (job_id, rank), or null if stale.
  JobEntry* RunningJobOfLocked(const WorkerEntry& w, const std::string& job_id,
                               int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // The end of a rank `w` no longer runs for a gang: a refused claim's
  // stage, or a rank of a restarting job's old gang. False when `d` is
  // neither.
  bool HandleOldStageDoneLocked(WorkerEntry& w, const v1::StageDone& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Rank d.stage() of e failed: the first real failure is the job's
  // pending failure, and the other ranks are cancelled.
  void RecordFailureLocked(JobEntry& e, const WorkerEntry& w,
                           const v1::StageDone& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Every rank of e has ended: the job succeeds, or its gang is broken.
  void GangEndedLocked(JobEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  ManagerState& s_;
  JobRecords& records_;
  JobTelemetry& telemetry_;
  GangStarter& gangs_;
  Recovery& recovery_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_STAGE_REPORTS_H_
