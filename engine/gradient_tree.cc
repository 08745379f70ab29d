#include "engine/gradient_tree.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace trainyard {

absl::Status GradientTree::AddLevel() {
  ASSIGN_OR_RETURN(Tensor buffer, ctx_->Empty(DType::kFloat32, {total_}));
  levels_.push_back(std::move(buffer));
  full_.push_back(false);
  return absl::OkStatus();
}

absl::Status GradientTree::Add(const Tensor& gradient) {
  if (gradient.numel() != total_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient of ", gradient.numel(), " elements, expected ", total_));
  }
  // carry: the block being moved up; -1 = `gradient` itself.
  int carry = -1;
  for (size_t l = 0;; ++l) {
    if (l == levels_.size()) RETURN_IF_ERROR(AddLevel());
    if (!full_[l]) {
      if (carry < 0) {
        RETURN_IF_ERROR(ctx_->CopyInto(gradient, &levels_[l]));
      } else {
        std::swap(levels_[l], levels_[carry]);  // no copy: buffers trade
      }
      full_[l] = true;
      ++added_;
      return absl::OkStatus();
    }
    // levels_[l] holds the block just before the carried one, of the same
    // size: their sum is the next level's block.
    RETURN_IF_ERROR(
        ctx_->AddInto(carry < 0 ? gradient : levels_[carry], &levels_[l]));
    full_[l] = false;
    carry = static_cast<int>(l);
  }
}

absl::StatusOr<Tensor> GradientTree::Leaf() {
  if (!full_.empty() && full_[0]) return Tensor();
  if (levels_.empty()) RETURN_IF_ERROR(AddLevel());
  return levels_[0];
}

void GradientTree::AddLeaf() {
  CHECK(!full_.empty() && !full_[0]) << "AddLeaf without an empty Leaf()";
  full_[0] = true;
  ++added_;
}

absl::Status GradientTree::Finish(Tensor* out) {
  if (added_ == 0) {
    return absl::FailedPreconditionError("no gradient was added this step");
  }
  int top = static_cast<int>(levels_.size()) - 1;
  while (!full_[top]) --top;
  for (int l = top - 1; l >= 0; --l) {
    if (full_[l]) RETURN_IF_ERROR(ctx_->AddInto(levels_[l], &levels_[top]));
  }
  RETURN_IF_ERROR(ctx_->CopyInto(levels_[top], out));
  full_.assign(full_.size(), false);
  added_ = 0;
  return absl::OkStatus();
}

}  // namespace trainyard
