// Gang scheduler: pure placement logic, no I/O, no clock, no gRPC.
//
// A job needing S pipeline stages starts only when S idle workers of its
// device kind are available at once (all stages or none). Queued jobs are
// considered highest priority first, FIFO (creation order) within a
// priority. There is no backfill within a device kind: once a job that can
// run eventually is waiting for idle workers, lower-ordered jobs of the same
// kind wait behind it, so a large gang cannot be starved by small ones. A job
// that can never fit (no registered worker of its kind, or fewer registered
// than it has stages) does not block anyone; its reason says why.
//
// Thread safety: stateless free functions; thread-safe.
#ifndef TRAINYARD_CONTROLLER_SCHEDULER_H_
#define TRAINYARD_CONTROLLER_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trainyard {

// "cpu" for a job device "" / "cpu"; "cuda" for "cuda". Other values are
// returned unchanged (and match no worker).
std::string JobDeviceKind(const std::string& job_device);
// "cpu" for a worker device "" / "cpu"; "cuda" for "cuda" or "cuda:N".
std::string WorkerDeviceKind(const std::string& worker_device);

struct SchedWorker {
  std::string id;
  std::string device;  // as the worker registered it, e.g. "cuda:0"
  bool idle = true;
};

struct SchedJob {
  std::string id;
  int32_t priority = 0;
  int64_t order = 0;  // creation order, smaller = older
  int stages = 1;
  int replicas = 1;    // the gang is stages x replicas workers
  std::string device;  // JobSpec.device
};

struct SchedDecision {
  struct Start {
    std::string job_id;
    std::vector<std::string> worker_ids;  // index = stage
  };
  // Jobs to start now, in the order they were chosen.
  std::vector<Start> starts;
  // Every queued job not started -> why it waits, e.g.
  //   "needs 4 idle cpu workers; 2 registered"
  //   "needs a cuda worker; none registered"
  //   "waiting for 2 idle cpu workers; 1 of 3 idle"
  //   "waiting behind job-3 (priority 5) for cpu workers"
  std::map<std::string, std::string> waiting;
};

// `workers` in registration order: stage k of a started job gets the k-th
// chosen idle worker in this order.
SchedDecision Schedule(std::vector<SchedJob> queued,
                       const std::vector<SchedWorker>& workers);

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_SCHEDULER_H_
