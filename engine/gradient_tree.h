// GradientTree: sums one stage's per-microbatch weight gradients in a fixed
// binary-tree order over the microbatch indices, the order that makes a run
// bitwise the same however its microbatches are dealt to data-parallel
// replicas (docs/ACCUMULATION.md).
//
// Microbatch m's gradient goes in after microbatches 0..m-1 (ascending, as
// every schedule runs its weight-gradient passes). The tree is a binary
// counter: level l holds the sum of an aligned block of 2^l microbatches;
// adding microbatch m carries upward like incrementing m, each carry being
// one element-wise float add of two equal-sized neighbouring blocks:
//
//   M = 4:  ((g0 + g1) + (g2 + g3))
//   M = 6:  ((g0 + g1) + (g2 + g3)) + (g4 + g5)
//
// Finish folds what remains from the highest level (the earliest
// microbatches) down. So the sum over an aligned block of 2^k microbatches
// is the same bits whoever computes it: a replica that holds microbatches
// [r 2^k, (r+1) 2^k) produces exactly the subtree R = 1 would, and adding
// the replicas' subtrees in the same counter order gives R = 1's result.
//
// Cost: floor(log2 M) + 1 gradient-sized buffers on the stage's device,
// one copy per microbatch whose carry stops at an empty level (none for
// the first of each pair when its gradient is written into Leaf()), M - 1
// adds per step and one copy at Finish (docs/BENCHMARKS.md measures it).
//
// Not thread-safe: used by its stage's thread.
#ifndef TRAINYARD_ENGINE_GRADIENT_TREE_H_
#define TRAINYARD_ENGINE_GRADIENT_TREE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/exec_context.h"

namespace trainyard {

class GradientTree {
 public:
  // Gradients of `total` float32 elements on ctx's device. `ctx` must
  // outlive the tree. Buffers are allocated as the tree first grows.
  GradientTree(const ExecContext* ctx, int64_t total)
      : ctx_(ctx), total_(total) {}

  // Adds the next microbatch's gradient (read, not kept: the caller may
  // overwrite it afterwards). Errors: allocation failure, a size mismatch.
  absl::Status Add(const Tensor& gradient);

  // Where the next microbatch's gradient may be written instead of Add's
  // copy: when it is the first of a pair (level 0 empty), level 0's buffer
  // (allocated on first use); otherwise an undefined Tensor, and the caller
  // writes elsewhere and calls Add. After writing all of a defined Leaf(),
  // AddLeaf() takes it as that microbatch's gradient: the same bits as Add
  // of the same values, without the copy (half the microbatches).
  // Errors: allocation failure.
  absl::StatusOr<Tensor> Leaf();
  void AddLeaf();

  // Writes the sum of everything added since the last Finish into *out and
  // starts over. FailedPrecondition when nothing was added.
  absl::Status Finish(Tensor* out);

  // Gradient-sized buffers held (the memory cost).
  int buffers() const { return static_cast<int>(levels_.size()); }
  int added() const { return added_; }

 private:
  // One more (empty) level, its buffer allocated.
  absl::Status AddLevel();

  const ExecContext* const ctx_;
  const int64_t total_;
  std::vector<Tensor> levels_;  // levels_[l]: a block of 2^l microbatches
  std::vector<bool> full_;
  int added_ = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_GRADIENT_TREE_H_
