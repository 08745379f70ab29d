#include "engine/step_scalars.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace trainyard {

absl::StatusOr<StepScalars> StepScalars::Create(const ExecContext* ctx,
                                                int num_params,
                                                int max_microbatches,
                                                int plugin_slots) {
  StepScalars s;
  s.ctx_ = ctx;
  s.num_params_ = num_params;
  s.max_microbatches_ = max_microbatches;
  s.stride_ = kCheckWords + plugin_slots;
  const int64_t words = int64_t{num_params} +
                        int64_t{max_microbatches} * s.stride_ + kTotalsWords;
  ASSIGN_OR_RETURN(s.device_, ctx->Zeros(DType::kFloat64, {words}));
  ASSIGN_OR_RETURN(s.host_, ctx->PinnedEmpty(DType::kFloat64, {words}));
  return s;
}

absl::Status StepScalars::Begin(int num_microbatches) {
  if (num_microbatches < 0 || num_microbatches > max_microbatches_) {
    return absl::InvalidArgumentError(
        absl::StrCat("step scalars for ", num_microbatches,
                     " microbatches; room for ", max_microbatches_));
  }
  num_microbatches_ = num_microbatches;
  return ctx_->SetZero(&device_);
}

DeviceTotalsArgs StepScalars::TotalsArgs(double clip) {
  DeviceTotalsArgs a;
  a.sums_of_squares = sums_of_squares();
  a.num_params = num_params_;
  a.microbatches = microbatch(0);
  a.num_microbatches = num_microbatches_;
  a.stride = stride_;
  a.clip = clip;
  a.totals = totals();
  return a;
}

absl::Status StepScalars::Read() {
  RETURN_IF_ERROR(ctx_->CopyToHostAsync(device_, &host_));
  return ctx_->Synchronize();
}

}  // namespace trainyard
