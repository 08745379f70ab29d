// GangStarter: starts queued jobs on gangs of idle workers. It asks the
// gang scheduler (controller/scheduler.h) which jobs can start, places
// their ranks (a restarted job keeps the workers of its last gang on their
// ranks, and prefers workers that hold its snapshots), chooses the state a
// restarted gang resumes from, and sends every rank its StageAssignment.
// Jobs left waiting get the scheduler's reason.
//
// Thread safety: every method needs the manager's lock.
#ifndef TRAINYARD_CONTROLLER_GANG_START_H_
#define TRAINYARD_CONTROLLER_GANG_START_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "controller/job_entry.h"
#include "controller/job_records.h"
#include "controller/job_telemetry.h"
#include "controller/manager_state.h"
#include "controller/scheduler.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

class GangStarter {
 public:
  GangStarter(ManagerState& state, JobRecords& records, JobTelemetry& telemetry)
      : s_(state), records_(records), telemetry_(telemetry) {}
  GangStarter(const GangStarter&) = delete;
  GangStarter& operator=(const GangStarter&) = delete;

  // Starts every queued job that can start now; records why the others
  // wait. Nothing after Shutdown.
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Queues a RECOVERING job for scheduling once its old gang has drained
  // and its backoff has passed.
  void MaybeRequeueLocked(JobEntry& e, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

 private:
  // The workers the scheduler may choose from, in the order it should
  // prefer them: those that may hold snapshots of a restarting job first
  // (so that its new gang can resume from them), then registration order.
  std::vector<SchedWorker> SchedWorkersLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Records `waiting` (the scheduler's reason) as e's reason.
  void SetWaitingLocked(JobEntry& e, const std::string& waiting)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Starts e's gang on `chosen` (worker id per rank).
  void StartJobLocked(JobEntry& e, const std::vector<std::string>& chosen)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Assigns rank k of e to worker_ids[k], adding each worker's address and
  // placement to `assign`.
  void AttachGangLocked(JobEntry& e, const std::vector<std::string>& worker_ids,
                        v1::StageAssignment& assign)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Whether worker `id` may still hold snapshots of `job_id`.
  bool HoldsSnapshotsOfLocked(const std::string& id, const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // For a restart of `e` on `gang` (worker id per rank): the newest step
  // after which every rank's snapshot is held in the gang and which is
  // newer than the newest committed checkpoint, with the rank that sends
  // each rank's; nothing when there is none.
  std::optional<v1::SnapshotResume> ChooseSnapshotLocked(
      const JobEntry& e, const std::vector<std::string>& gang)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  ManagerState& s_;
  JobRecords& records_;
  JobTelemetry& telemetry_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_GANG_START_H_
