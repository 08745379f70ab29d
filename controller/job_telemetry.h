// JobTelemetry: what the controller keeps, in memory, for people watching
// its jobs: each job's span traces of its newest steps (for GetTrace), its
// workers' newest log lines (for WatchLogs, rate limited per worker), its
// TensorBoard event file (under <data_dir>/tensorboard/<job_id>), and the
// counts /metrics reports.
//
// Traces, log lines and the newest events in memory (JobEntry::event_log,
// which JobRecords makes) are kept for jobs that have not ended and for the
// `keep_ended_jobs` jobs that ended last (JobManagerOptions).
//
// Thread safety: every method needs the manager's lock.
#ifndef TRAINYARD_CONTROLLER_JOB_TELEMETRY_H_
#define TRAINYARD_CONTROLLER_JOB_TELEMETRY_H_

#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "controller/job_entry.h"
#include "controller/log_ring.h"
#include "controller/manager_state.h"
#include "controller/manager_status.h"
#include "controller/trace_buffer.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

class JobTelemetry {
 public:
  explicit JobTelemetry(ManagerState& state) : s_(state) {}
  JobTelemetry(const JobTelemetry&) = delete;
  JobTelemetry& operator=(const JobTelemetry&) = delete;

  // e's trace buffer and log ring, made on first use; null for an ended
  // job that has none (they are made only while a job may still run).
  TraceBuffer* TracesLocked(JobEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  LogRing* LogRingLocked(JobEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  // Appends a log line `w` sent to its job's ring, when `w` runs (or
  // drains) that rank and its rate allows; a notice line tells of lines
  // dropped before it.
  void TakeLogLineLocked(WorkerEntry& w, const v1::StageLogLine& line)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  // <data_dir>/tensorboard/<job_id>.
  std::string TensorboardDir(const std::string& job_id) const;
  // Adds a published step or eval to e's event file (opened on first use;
  // after an error, logged once, the job writes no more events).
  void WriteTensorboardLocked(JobEntry& e, const v1::JobEvent& event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  // e has ended: closes its event file and its log ring, and keeps its
  // traces and log lines among the ended jobs', and its in-memory events
  // (KeepEventLogLocked), each dropping the oldest beyond keep_ended_jobs.
  void EndLocked(JobEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Keeps ended e's in-memory events among the ended jobs' (once),
  // dropping the oldest's beyond keep_ended_jobs: at its end, and when
  // they were loaded again for a watcher (which costs no other job its
  // traces or log lines).
  void KeepEventLogLocked(JobEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  ControllerStats StatsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

 private:
  // Adds e's id to `kept` (once); beyond keep_ended_jobs (at least 1), the
  // oldest leaves it, and `drop` frees what that job held.
  template <typename Drop>
  void KeepNewestLocked(std::deque<std::string>& kept, JobEntry& e, Drop drop)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  ManagerState& s_;
  // Ended jobs that still hold traces or log lines, and those that still
  // hold events in memory; oldest first.
  std::deque<std::string> ended_with_telemetry_ ABSL_GUARDED_BY(s_.mu);
  std::deque<std::string> ended_event_logs_ ABSL_GUARDED_BY(s_.mu);
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_JOB_TELEMETRY_H_
