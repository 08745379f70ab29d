// JobRecords: a job's record, in memory and in the store together: its
// state, its event history (the JobEventLog WatchJob reads: the newest
// events_in_memory loaded from the store on first use, the rest read from
// it) and the notes in it, and the end of a job.
//
// A write that fails is logged and the in-memory state goes on: running
// jobs must keep being served.
//
// Thread safety: every method needs the manager's lock.
#ifndef TRAINYARD_CONTROLLER_JOB_RECORDS_H_
#define TRAINYARD_CONTROLLER_JOB_RECORDS_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "controller/job_entry.h"
#include "controller/job_event_log.h"
#include "controller/job_telemetry.h"
#include "controller/manager_state.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

class JobRecords {
 public:
  JobRecords(ManagerState& state, JobTelemetry& telemetry)
      : s_(state), telemetry_(telemetry) {}
  JobRecords(const JobRecords&) = delete;
  JobRecords& operator=(const JobRecords&) = delete;

  // e's event log, loaded from the store on first use (a job with no
  // stored event gets its state as event 0). One made again for an ended
  // job counts among the ended jobs kept (JobTelemetry::KeepEventLogLocked).
  JobEventLog* EventLogLocked(JobEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Persists e.job plus `event` (when not null) and appends the event.
  void CommitLocked(JobEntry& e, v1::JobEvent* event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Moves e to `state`, recorded as an event; a terminal state ends its
  // telemetry.
  void SetStateLocked(JobEntry& e, v1::JobState state,
                      const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Records a JobNote in e's history (once per text; cut at 1 KiB).
  void NoteLocked(JobEntry& e, int rank, std::string text)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Ends a QUEUED, RUNNING or RECOVERING job in the terminal `state`:
  // detaches its workers, sending CancelStage with `reason` to those still
  // on it when `cancel_workers`, and fails the rendezvous calls waiting in
  // it.
  void FinishJobLocked(JobEntry& e, v1::JobState state,
                       const std::string& reason, bool cancel_workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

 private:
  ManagerState& s_;
  JobTelemetry& telemetry_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_JOB_RECORDS_H_
