// Recovery: automatic restarts of a job whose gang broke
// (JobSpec.recovery, docs/CONTROLLER.md). When a worker of a running job
// is lost, or a rank fails for a reason a restart may cure, the job goes
// RECOVERING: the rest of its gang is cancelled and drained (each rank
// reports its end or its worker is lost), then, after the restart's
// backoff, the job is scheduled again like a queued one and every rank
// resumes from in-memory snapshots or the newest checkpoint that verifies.
// Past max_restarts the job fails with every restart's reason.
//
// Once the restarted gang has restored and made its first step, the
// restart is recorded as a JobRecovery event with its timings.
//
// Thread safety: every method needs the manager's lock.
#ifndef TRAINYARD_CONTROLLER_RECOVERY_H_
#define TRAINYARD_CONTROLLER_RECOVERY_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "controller/gang_start.h"
#include "controller/job_entry.h"
#include "controller/job_records.h"
#include "controller/manager_state.h"

namespace trainyard {

class Recovery {
 public:
  Recovery(ManagerState& state, JobRecords& records, GangStarter& gangs)
      : s_(state), records_(records), gangs_(gangs) {}
  Recovery(const Recovery&) = delete;
  Recovery& operator=(const Recovery&) = delete;

  // The running gang of `e` is broken by `cause`: restarts the job when
  // `recoverable` and restarts are left, else fails it with every
  // restart's reason.
  void GangBrokenLocked(JobEntry& e, std::string cause, bool recoverable)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Records the JobRecovery event of e's current restart, whose gang has
  // restored and completed its first step (or ended) at `now`. A first
  // step reported before every StageStarted (other streams) is remembered,
  // and the event is recorded when the last StageStarted arrives.
  void RecordRecoveryLocked(JobEntry& e, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

 private:
  void BeginRecoveryLocked(JobEntry& e, const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Cancels the ranks of e's gang still running (they become e's
  // draining workers) and detaches the workers of those that ended.
  void StopGangLocked(JobEntry& e, const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  ManagerState& s_;
  JobRecords& records_;
  GangStarter& gangs_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_RECOVERY_H_
