// SnapshotCache: the in-memory snapshots (JobSpec.recovery.snapshot_every)
// a worker holds for one job: its own stage's and its neighbours' copies,
// the newest two steps of each stage. They outlive the stage, so a restart
// can resume from them (engine/stage_runner.h's DistributeSnapshots).
//
// Thread safety: every method may be called from any thread.
#ifndef TRAINYARD_WORKER_SNAPSHOT_CACHE_H_
#define TRAINYARD_WORKER_SNAPSHOT_CACHE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/tensor.h"
#include "engine/stage_runner.h"

namespace trainyard {

class SnapshotCache {
 public:
  // `worker_name` starts the lines it logs.
  explicit SnapshotCache(std::string worker_name)
      : worker_name_(std::move(worker_name)) {}

  // Holds snapshots of `job_id` from now on: another job's are of no use
  // any more and are dropped.
  void UseFor(const std::string& job_id);
  // Keeps `snapshot` of `job_id` (dropping another job's), the newest two
  // steps of its stage.
  void Keep(const std::string& job_id, StageSnapshot snapshot);
  // The kept snapshot of `stage` after `step`, or an undefined tensor.
  Tensor Held(const std::string& job_id, int stage, int64_t step);

 private:
  void UseForLocked(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string worker_name_;
  absl::Mutex mu_;
  std::string job_ ABSL_GUARDED_BY(mu_);
  // stage -> step -> bytes.
  std::map<int, std::map<int64_t, Tensor>> snapshots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_SNAPSHOT_CACHE_H_
