// CheckpointWriter: one background thread that runs a stage's checkpoint
// I/O — writing its stage file and, on the first stage, committing the
// manifest and pruning — in submission order, while the step loop trains
// on. The step loop hands it a host copy of the state (Stage::
// CheckpointContents), so nothing it writes changes under it.
//
// Thread safety: Submit, status, completed and Drain may be called from any
// thread; tasks run one at a time on the writer's thread.
#ifndef TRAINYARD_ENGINE_CHECKPOINT_WRITER_H_
#define TRAINYARD_ENGINE_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace trainyard {

class CheckpointWriter {
 public:
  CheckpointWriter();
  // Runs what is queued, then stops.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Queues `task`; returns its sequence number (1, 2, ...). After a task
  // failed, later ones are skipped (status() keeps the first error).
  int64_t Submit(std::function<absl::Status()> task);
  // The first error of any task so far (OK if none).
  absl::Status status() const;
  // Tasks finished (run or skipped) so far.
  int64_t completed() const;
  // Task `seq` finished and no task so far failed (one consistent look).
  bool Succeeded(int64_t seq) const;
  // Waits until task `seq` (from Submit) finished; returns status().
  absl::Status WaitFor(int64_t seq);
  // Waits until every submitted task finished; returns status().
  absl::Status Drain();

 private:
  void Loop();

  mutable absl::Mutex mu_;
  std::deque<std::function<absl::Status()>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_CHECKPOINT_WRITER_H_
