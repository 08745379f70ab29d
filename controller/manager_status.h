// What the JobManager reports about itself: its registered workers
// (WorkerInfo, for ListWorkers) and the counts the controller's /metrics
// reports (ControllerStats, for GetStats).
//
// Thread safety: plain data.
#ifndef TRAINYARD_CONTROLLER_MANAGER_STATUS_H_
#define TRAINYARD_CONTROLLER_MANAGER_STATUS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

// A registered worker, as ListWorkers shows it.
struct WorkerInfo {
  std::string id;
  std::string name;
  std::string device;
  std::string job_id;  // empty = idle
  int rank = -1;       // of job_id's gang
  v1::WorkerCapabilities caps;
  absl::Duration since_heartbeat;
};

// What the controller's /metrics reports (read at each scrape).
struct ControllerStats {
  std::map<v1::JobState, int64_t> jobs;  // every state, 0s included
  int64_t queued = 0;  // waiting to be scheduled (QUEUED and restarting)
  // (device, "idle" | "busy") -> workers.
  std::map<std::pair<std::string, std::string>, int64_t> workers;
  int64_t restarts = 0;  // automatic restarts, over every job
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_MANAGER_STATUS_H_
