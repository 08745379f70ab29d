#include "engine/shared_device_replicas.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace trainyard {

SharedDeviceReplicas::SharedDeviceReplicas(int size)
    : size_(size), gradients_(size), folded_(size), trees_(size) {}

void SharedDeviceReplicas::Abort(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (aborted_.empty()) aborted_ = why.empty() ? "a replica failed" : why;
}

absl::Status SharedDeviceReplicas::Barrier(int64_t* round,
                                           absl::Duration timeout,
                                           const char* what) {
  absl::MutexLock lock(&mu_);
  const int64_t mine = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
  } else {
    auto passed = [this, mine]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return generation_ != mine || !aborted_.empty();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&passed), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("replicas on one device: a replica did not reach ", what,
                       " within ", absl::FormatDuration(timeout)));
    }
  }
  if (!aborted_.empty()) {
    return absl::AbortedError(
        absl::StrCat("replicas on one device: ", aborted_));
  }
  *round = mine;
  return absl::OkStatus();
}

absl::Status SharedDeviceReplicas::SumInTreeOrder(int rank,
                                                  const ExecContext& ctx,
                                                  Tensor* gradient,
                                                  absl::Duration timeout) {
  if (rank < 0 || rank >= size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica ", rank, " outside [0, ", size_, ") of the group"));
  }
  if (gradient->dtype() != DType::kFloat32 ||
      gradient->device() != ctx.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica ", rank, ": the gradient must be float32 on ",
                     ctx.device().ToString()));
  }
  if (size_ == 1) return absl::OkStatus();
  gradients_[rank] = *gradient;  // read by the others after the barrier
  int64_t round = 0;
  RETURN_IF_ERROR(Barrier(&round, timeout, "the gradient sum"));
  const int64_t n = gradient->numel();
  for (int r = 0; r < size_; ++r) {
    if (gradients_[r].numel() != n || gradients_[r].device() != ctx.device()) {
      Abort("mismatched gradients");
      return absl::InvalidArgumentError(absl::StrCat(
          "replica ", r, "'s gradient has ", gradients_[r].numel(),
          " elements on ", gradients_[r].device().ToString(), ", replica ",
          rank, "'s ", n, " on ", ctx.device().ToString()));
    }
  }
  // Slice r: n / R elements (the first n % R one more), as ReplicaGroup.
  auto begin_of = [&](int r) {
    return r * (n / size_) + std::min<int64_t>(r, n % size_);
  };
  const int64_t lo = begin_of(rank), hi = begin_of(rank + 1);
  const int64_t mine = hi - lo;
  if (mine > 0) {
    if (folded_[rank].numel() != mine) {
      ASSIGN_OR_RETURN(folded_[rank], ctx.Empty(DType::kFloat32, {mine}));
      trees_[rank] = std::make_unique<GradientTree>(&ctx, mine);
    }
    for (int r = 0; r < size_; ++r) {
      RETURN_IF_ERROR(trees_[rank]->Add(gradients_[r].Rows(lo, hi)));
    }
    RETURN_IF_ERROR(trees_[rank]->Finish(&folded_[rank]));
  }
  RETURN_IF_ERROR(Barrier(&round, timeout, "the folded slices"));
  // Every replica's gradient gets every folded slice (its own included).
  for (int r = 0; r < size_; ++r) {
    const int64_t a = begin_of(r), b = begin_of(r + 1);
    if (b == a) continue;
    Tensor slice = gradient->Rows(a, b);
    RETURN_IF_ERROR(ctx.CopyInto(folded_[r], &slice));
  }
  // Nobody may reuse its gradient (or fold into it) before every replica
  // has queued its copies of the others' slices.
  return Barrier(&round, timeout, "the copies");
}

}  // namespace trainyard
