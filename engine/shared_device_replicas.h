// SharedDeviceReplicas: the R data-parallel replicas of one stage when they
// run as threads of one process on one device (`trainyard train` with
// parallelism.replicas on cuda:N or sim:N). They sum their gradients on the
// device, through each other's device buffers, in ReplicaGroup's tree
// order (engine/replica_group.h): replica r folds slice r of every
// replica's block sum in replica order with a GradientTree, then every
// replica copies the R folded slices into its own gradient. The same float
// additions in the same grouping as ReplicaGroup and as one replica
// summing every microbatch, so R replicas give R = 1's bits; no host
// memory, no copy between host and device, no wait for the device.
//
// Ordering: the replicas share their device's one stream
// (kernels/exec_context.h), so work is ordered by the order the host
// queues it in; two barriers make every replica queue its fold after all
// gradients are final, and its copies after all folds are queued.
//
// Thread safety: one object per stage, shared by its R replica threads;
// each calls SumInTreeOrder with its own rank, once per step.
#ifndef TRAINYARD_ENGINE_SHARED_DEVICE_REPLICAS_H_
#define TRAINYARD_ENGINE_SHARED_DEVICE_REPLICAS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/tensor.h"
#include "engine/gradient_tree.h"
#include "kernels/exec_context.h"

namespace trainyard {

class SharedDeviceReplicas {
 public:
  explicit SharedDeviceReplicas(int size);

  int size() const { return size_; }

  // Replica `rank`'s *gradient (float32 [n] on ctx's device: its block
  // sum) becomes the sum over every replica in tree order. Every replica's
  // gradient has the same length and lives on the same device; `ctx` is
  // the calling replica's. Waits for the other replicas at two barriers.
  // Errors: a bad rank or a mismatched gradient (InvalidArgument); a
  // replica that does not arrive within `timeout` (DeadlineExceeded naming
  // the barrier), or that failed (Aborted, from Abort).
  absl::Status SumInTreeOrder(int rank, const ExecContext& ctx,
                              Tensor* gradient, absl::Duration timeout);

  // Fails every current and later SumInTreeOrder with `why` (a replica
  // whose step failed, so the others stop waiting for it).
  void Abort(const std::string& why);

 private:
  // Waits until every replica has arrived at barrier round `round`.
  absl::Status Barrier(int64_t* round, absl::Duration timeout,
                       const char* what);

  const int size_;
  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::string aborted_ ABSL_GUARDED_BY(mu_);
  // Each replica's gradient this round (set before the first barrier).
  std::vector<Tensor> gradients_;
  // Per replica: its folded slice and the tree that folds it.
  std::vector<Tensor> folded_;
  std::vector<std::unique_ptr<GradientTree>> trees_;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_SHARED_DEVICE_REPLICAS_H_
