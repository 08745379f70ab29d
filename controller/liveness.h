// Liveness: the JobManager's clock. A thread that, a few times per
// heartbeat interval, declares workers lost that have been silent past
// heartbeat_timeout, fails rendezvous calls that timed out, and settles
// the jobs whose deadlines have passed: a rank's failure not explained by
// a lost worker within the grace, an adoption whose ranks were not all
// reclaimed (adopt_timeout), an old gang that has not stopped
// (drain_timeout), a restart's backoff.
//
// A lost worker's running job is restarted or failed (controller/
// recovery.h); a lost worker of a restarting job no longer holds it up.
//
// Time the controller itself did not run is counted against nobody. When
// a tick comes more than a heartbeat interval after the one before (the
// process was stopped, starved of CPU, or blocked on its lock by a slow
// disk), the workers could not be heard in that time: the gap beyond the
// tick period is credited to every worker's last_seen, and every deadline
// above (the jobs' and the waiting rendezvous Gets') moves by as much.
// Heartbeats that were sent during the stall are then read before anyone
// is declared lost; a worker that was silent before the stall and stays
// silent after it is lost as late as the stall lasted. The gap is the
// checker's own: were it alone starved while the streams were read, a
// lost worker would be found that much later too.
//
// Thread safety: Start and Join are called by the JobManager; the
// *Locked methods need the manager's lock.
#ifndef TRAINYARD_CONTROLLER_LIVENESS_H_
#define TRAINYARD_CONTROLLER_LIVENESS_H_

#include <algorithm>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "controller/gang_start.h"
#include "controller/job_entry.h"
#include "controller/manager_state.h"
#include "controller/recovery.h"

namespace trainyard {

class Liveness {
 public:
  Liveness(ManagerState& state, GangStarter& gangs, Recovery& recovery)
      : s_(state),
        gangs_(gangs),
        recovery_(recovery),
        period_(std::min(state.options.heartbeat_interval / 2,
                         absl::Milliseconds(100))) {}
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Starts the thread; it runs until ManagerState::shutting_down is set.
  void Start();
  // Waits for the thread to end (after shutting_down is set).
  void Join();

  // Drops worker `worker_id` (its stream is closed, UNAVAILABLE naming
  // `why`); its job is restarted or failed, or, when restarting, no longer
  // waits for it.
  void LoseWorkerLocked(const std::string& worker_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(s_.mu);
  void TickLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // How long the controller did not run before `now`: the gap since the
  // last tick beyond the tick period, when the gap is longer than a
  // heartbeat interval (shorter ones are well inside the heartbeat
  // timeout, which is longer than the interval); zero otherwise. Makes
  // `now` the last tick.
  absl::Duration StallBefore(absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Counts `stall` against nobody: credits every worker's last_seen (up
  // to `now`) and moves every deadline by it.
  void ExcuseStallLocked(absl::Duration stall, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Fails (or restarts) the running jobs whose pending failure's grace has
  // passed, restarts jobs whose adoption timed out, drops the workers of
  // old gangs that did not stop in time, and queues recovering jobs whose
  // backoff has passed.
  void SettleDeadlinesLocked(absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // The deadlines of a RECOVERING job; true when a worker was dropped.
  bool SettleRecoveringLocked(JobEntry& e, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // The deadlines of a RUNNING job; true when its gang was broken.
  bool SettleRunningLocked(JobEntry& e, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  ManagerState& s_;
  GangStarter& gangs_;
  Recovery& recovery_;
  // A few times per heartbeat interval.
  const absl::Duration period_;
  absl::Time last_tick_ ABSL_GUARDED_BY(s_.mu) = absl::InfinitePast();
  std::thread thread_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_LIVENESS_H_
