// ReplicaGroup: the R data-parallel replicas of one pipeline stage, which
// sum their gradients over Gloo (Debian's libgloo) in the order of
// engine/gradient_tree.h, so that R replicas give R = 1's bits
// (docs/ACCUMULATION.md).
//
// Each replica holds the tree sum of its own aligned block of M/R
// microbatches. SumInTreeOrder is a reduce-scatter and an all-gather in
// tree order: the gradient is cut into R slices; replica r receives slice r
// of every replica's block sum (Gloo's alltoallv over its TCP transport),
// folds the R copies with a GradientTree in replica order, the same float
// additions, in the same grouping, as one replica summing all M
// microbatches, and the folded slices are all-gathered (allgatherv) back
// into every replica's gradient. Each replica sends and folds 1/R of what
// gathering every whole copy would. (Gloo's own allreduce adds in ring
// order, which differs per chunk and is not R = 1's grouping: it is not
// used.) Memory: one gradient-sized host buffer plus the tree's
// log2(R) + 1 slices, kept between calls.
//
// Rendezvous: Gloo's ranks find each other through a write-once store;
// here that is our Rendezvous (transport/rendezvous.h): the controller's
// per-job store over the worker stream in the daemon (Debian's Gloo ships
// no TCP store), an InProcessRendezvous for ranks as threads.
//
// Thread safety: one ReplicaGroup per replica; its calls from one thread.
#ifndef TRAINYARD_ENGINE_REPLICA_GROUP_H_
#define TRAINYARD_ENGINE_REPLICA_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/tensor.h"
#include "engine/gradient_tree.h"
#include "transport/rendezvous.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace trainyard {

struct ReplicaGroupOptions {
  int rank = 0;  // this replica, 0..size-1
  int size = 1;  // R
  // Namespaces the group's keys in the rendezvous, e.g. "job-7/stage-1".
  std::string key_prefix;
  // The address Gloo's TCP transport binds and advertises.
  std::string hostname = "127.0.0.1";
  // Longest wait for every replica to join, and for one collective.
  absl::Duration timeout = absl::Seconds(30);
};

class ReplicaGroup {
 public:
  // Joins the group: blocks until all `size` replicas have connected
  // (a full mesh of Gloo TCP pairs). `rendezvous` is used only during the
  // call. Errors: InvalidArgument for a bad rank/size; DeadlineExceeded or
  // Unavailable naming the group when a replica does not join in time.
  static absl::StatusOr<std::unique_ptr<ReplicaGroup>> Join(
      Rendezvous* rendezvous, const ReplicaGroupOptions& options);
  ~ReplicaGroup();

  // *gradient (float32 [n] on the host, this replica's block sum) becomes
  // the sum over every replica in tree order: the same bits on every
  // replica. Errors: a replica that fails or is gone (Unavailable naming
  // the group and Gloo's reason), DeadlineExceeded after the timeout.
  absl::Status SumInTreeOrder(Tensor* gradient);

  // Every replica's `mine` (the same length on each), concatenated in
  // replica order. Errors as SumInTreeOrder.
  absl::StatusOr<std::vector<double>> AllGather(
      const std::vector<double>& mine);

  int rank() const { return options_.rank; }
  int size() const { return options_.size; }

 private:
  ReplicaGroup(ReplicaGroupOptions options,
               std::shared_ptr<gloo::Context> context);
  std::string Name() const;
  // `bytes` from every replica into out[r * bytes, (r + 1) * bytes).
  absl::Status AllGatherBytes(const void* in, size_t bytes, char* out);
  // SumInTreeOrder's steps; slice r holds length[r] elements, this
  // replica's `mine`. ExchangeSlices sends slice r of `gradient` to replica
  // r and receives every replica's copy of this replica's slice into
  // copies_; FoldSlices sums copies_' rows into folded_ in replica order;
  // GatherSums brings every replica's folded_ back into `gradient`.
  absl::Status ExchangeSlices(Tensor* gradient,
                              const std::vector<int64_t>& length, int64_t mine);
  absl::Status FoldSlices(int64_t mine);
  absl::Status GatherSums(Tensor* gradient, const std::vector<int64_t>& length,
                          int64_t mine);

  const ReplicaGroupOptions options_;
  std::shared_ptr<gloo::Context> context_;  // null when size == 1
  uint32_t next_tag_ = 0;
  // SumInTreeOrder's buffers for this replica's slice (kept between calls):
  // every replica's copy of it [R, slice], the tree, and the folded sum.
  Tensor copies_;
  std::unique_ptr<GradientTree> tree_;
  Tensor folded_;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_REPLICA_GROUP_H_
