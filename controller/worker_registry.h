// WorkerRegistry: the workers connected to the controller. It registers a
// worker (a reconnecting one keeps its id, and may reclaim the rank it
// still runs), routes each message a worker sends (stage reports, log
// lines, heartbeats) to the part that handles it, serves the rendezvous of
// running jobs to the workers running their ranks
// (controller/rendezvous_table.h), and loses a worker whose stream ended.
//
// Every message counts as a heartbeat (controller/liveness.h).
//
// Thread safety: the public methods take the manager's lock and deliver
// what they queued to the workers after releasing it.
#ifndef TRAINYARD_CONTROLLER_WORKER_REGISTRY_H_
#define TRAINYARD_CONTROLLER_WORKER_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/adoption.h"
#include "controller/gang_start.h"
#include "controller/job_entry.h"
#include "controller/job_telemetry.h"
#include "controller/liveness.h"
#include "controller/manager_state.h"
#include "controller/manager_status.h"
#include "controller/stage_reports.h"
#include "controller/worker_outbox.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

class WorkerRegistry {
 public:
  WorkerRegistry(ManagerState& state, JobTelemetry& telemetry,
                 GangStarter& gangs, Adoption& adoption, Liveness& liveness,
                 StageReports& reports)
      : s_(state),
        telemetry_(telemetry),
        gangs_(gangs),
        adoption_(adoption),
        liveness_(liveness),
        reports_(reports) {}
  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  // JobManager::RegisterWorker, OnWorkerMessage, OnWorkerStreamEnded and
  // ListWorkers.
  absl::StatusOr<std::string> RegisterWorker(const v1::RegisterWorker& reg,
                                             std::shared_ptr<WorkerLink> link)
      ABSL_LOCKS_EXCLUDED(s_.mu);
  void OnWorkerMessage(const std::string& worker_id,
                       const v1::WorkerMessage& msg, const WorkerLink* link)
      ABSL_LOCKS_EXCLUDED(s_.mu);
  void OnWorkerStreamEnded(const std::string& worker_id, const std::string& why,
                           const WorkerLink* link) ABSL_LOCKS_EXCLUDED(s_.mu);
  std::vector<WorkerInfo> ListWorkers() ABSL_LOCKS_EXCLUDED(s_.mu);

 private:
  // The number n of the id ("w-<n>") a registering worker gets: that of
  // the id it asks for when that is free and plausible, else a new one.
  int64_t WorkerNumberLocked(const std::string& requested)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // Hands msg to the part that handles its kind.
  void DispatchLocked(WorkerEntry& w, const v1::WorkerMessage& msg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  void HandleRendezvousPutLocked(WorkerEntry& w, const v1::RendezvousPut& put)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  void HandleRendezvousGetLocked(WorkerEntry& w, const v1::RendezvousGet& get)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);
  // OK when `w` runs a rank of the RUNNING job `job_id`; otherwise why it
  // may not use that job's rendezvous.
  absl::Status CheckRendezvousCallerLocked(const WorkerEntry& w,
                                           const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_.mu);

  ManagerState& s_;
  JobTelemetry& telemetry_;
  GangStarter& gangs_;
  Adoption& adoption_;
  Liveness& liveness_;
  StageReports& reports_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_WORKER_REGISTRY_H_
