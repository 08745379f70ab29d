// Adoption: how a restarted controller takes up the jobs its previous
// process left. It loads every job from the store: a QUEUED job is queued
// again; a RUNNING job's workers keep training while no controller
// listens, so the job waits (adopt_timeout) for them to reconnect and
// claim their ranks (RegisterWorker.running), and runs on as if nothing
// happened once every rank is reclaimed; a RECOVERING job waits for its
// old gang to stop before it is scheduled again. Claims that do not fit
// are refused, and the worker is told to stop that stage.
//
// (A RUNNING job whose ranks are not all reclaimed in time is restarted by
// the liveness checker, controller/liveness.h.)
//
// Thread safety: LoadJobs takes the manager's lock; the *Locked methods
// need it.
#ifndef TRAINYARD_CONTROLLER_ADOPTION_H_
#define TRAINYARD_CONTROLLER_ADOPTION_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "controller/gang_start.h"
#include "controller/job_entry.h"
#include "controller/job_records.h"
#include "controller/manager_state.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

class Adoption {
 public:
  Adoption(ManagerState& state, JobRecords& records, GangStarter& gangs)
      : s_(state), records_(records), gangs_(gangs) {}
  Adoption(const Adoption&) = delete;
  Adoption& operator=(const Adoption&) = delete;

  // Loads every job from the store and takes up those that have not
  // ended (a job whose spec no longer plans fails).
  absl::Status LoadJobs() ABSL_LOCKS_EXCLUDED(s_.mu);

  // Re-attaches a reconnecting worker to the rank it claims, or tells it
  // to stop that stage.
  void ClaimStageLocked(WorkerEntry& w, const v1::StageClaim& claim)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

 private:
  // Adds a job loaded from the store, the `order`-th.
  JobEntry& AddLoadedJobLocked(v1::Job job, int64_t order)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Plans a loaded job that has not ended and takes it up by its state.
  void TakeUpLocked(JobEntry& e, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // A RUNNING job: waits for its workers to reclaim its ranks.
  void AwaitClaimsLocked(JobEntry& e, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // A RECOVERING job: waits for its old gang to stop.
  void AwaitOldGangLocked(JobEntry& e, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Gives rank `rank` of e back to `w`.
  void ReclaimLocked(JobEntry& e, WorkerEntry& w, int rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Tells `w` to stop the stage it claimed, for `refusal`; `e` is the
  // claimed job, null when there is none.
  void RefuseClaimLocked(JobEntry* e, WorkerEntry& w,
                         const v1::StageClaim& claim,
                         const std::string& refusal)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  ManagerState& s_;
  JobRecords& records_;
  GangStarter& gangs_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_ADOPTION_H_
