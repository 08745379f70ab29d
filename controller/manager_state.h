// ManagerState: what every part of the JobManager shares, guarded by one
// mutex: the jobs, the connected workers, the scheduling queue, the
// rendezvous of running jobs, the outbox to the workers, the store and the
// options.
//
// Ownership: owns the store, every JobEntry and WorkerEntry, the
// rendezvous table and the outbox. Thread safety: the fields marked
// guarded need `mu`.
#ifndef TRAINYARD_CONTROLLER_MANAGER_STATE_H_
#define TRAINYARD_CONTROLLER_MANAGER_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "controller/job_entry.h"
#include "controller/job_manager_options.h"
#include "controller/job_store.h"
#include "controller/rendezvous_table.h"
#include "controller/worker_outbox.h"

namespace trainyard {

struct ManagerState {
  ManagerState(const JobManagerOptions& options,
               std::unique_ptr<JobStore> store)
      : options(options),
        store(std::move(store)),
        rendezvous(options.rendezvous_limits),
        outbox(&mu) {}

  const JobManagerOptions options;
  // Shared with the jobs' event logs, which read their older events from
  // it and may outlive the manager in a watcher's hands.
  const std::shared_ptr<JobStore> store;

  absl::Mutex mu;
  // Set once by JobManager::Shutdown: worker traffic is ignored after it.
  bool shutting_down ABSL_GUARDED_BY(mu) = false;
  // Every job, by id; jobs never leave.
  std::map<std::string, std::unique_ptr<JobEntry>> jobs ABSL_GUARDED_BY(mu);
  // RequestKey(owner, request_id) -> job id.
  std::map<std::string, std::string> job_by_request ABSL_GUARDED_BY(mu);
  // Jobs waiting for a gang: QUEUED ones, and RECOVERING ones whose old
  // gang has drained and whose backoff has passed.
  std::set<std::string> queued ABSL_GUARDED_BY(mu);
  // Registered workers, by id.
  std::map<std::string, WorkerEntry> workers ABSL_GUARDED_BY(mu);
  int64_t next_worker ABSL_GUARDED_BY(mu) = 1;  // the number of the next id
  RendezvousTable rendezvous ABSL_GUARDED_BY(mu);
  WorkerOutbox outbox;  // guarded by mu
};

// Queues each rendezvous reply to its worker (dropped for a worker gone
// since).
void SendRendezvousRepliesLocked(ManagerState& s,
                                 std::vector<RendezvousTable::Reply> replies)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_MANAGER_STATE_H_
