#include "worker/snapshot_cache.h"

#include <utility>

#include "glog/logging.h"

namespace trainyard {

void SnapshotCache::UseFor(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  UseForLocked(job_id);
}

void SnapshotCache::UseForLocked(const std::string& job_id) {
  if (job_ != job_id) {
    snapshots_.clear();
    job_ = job_id;
  }
}

void SnapshotCache::Keep(const std::string& job_id, StageSnapshot snapshot) {
  absl::MutexLock lock(&mu_);
  UseForLocked(job_id);
  auto& steps = snapshots_[snapshot.stage];
  // A snapshot older than those held means the job restarted from an
  // earlier step: the later ones belong to the abandoned run (the
  // controller forgets them too) and would push out the new run's.
  steps.erase(steps.upper_bound(snapshot.step), steps.end());
  if (steps.empty()) {
    LOG(INFO) << "trainyard-worker " << worker_name_ << ": keeping "
              << "in-memory snapshots of job " << job_id << " stage "
              << snapshot.stage << " (" << snapshot.bytes.nbytes()
              << " bytes each, the newest two steps)";
  }
  steps[snapshot.step] = std::move(snapshot.bytes);
  while (steps.size() > 2) steps.erase(steps.begin());
}

Tensor SnapshotCache::Held(const std::string& job_id, int stage, int64_t step) {
  absl::MutexLock lock(&mu_);
  if (job_ != job_id) return Tensor();
  auto it = snapshots_.find(stage);
  if (it == snapshots_.end()) return Tensor();
  auto s = it->second.find(step);
  return s == it->second.end() ? Tensor() : s->second;
}

}  // namespace trainyard
