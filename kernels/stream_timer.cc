#include "kernels/stream_timer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/runtime.h"

namespace trainyard {

StreamTimer::~StreamTimer() {
  for (CUevent_st* e : events_) gpu::DestroyEvent(e);
}

absl::Status StreamTimer::Start() {
  num_marks_ = 0;
  clock_.clear();
  return Mark().status();
}

absl::StatusOr<int> StreamTimer::Mark() {
  if (num_marks_ >= kMaxMarks) {
    return absl::ResourceExhaustedError(
        absl::StrCat("more than ", kMaxMarks, " timing marks in one step"));
  }
  const int id = num_marks_;
  if (ctx_->device().is_cuda()) {
    if (id == static_cast<int>(events_.size())) {
      ASSIGN_OR_RETURN(CUevent_st * e, gpu::CreateEvent());
      events_.push_back(e);
    }
    RETURN_IF_ERROR(gpu::RecordEvent(events_[id], ctx_->stream()));
  } else {
    clock_.push_back(Clock::now());
  }
  ++num_marks_;
  return id;
}

absl::StatusOr<int64_t> StreamTimer::Micros(int id) const {
  if (id < 0 || id >= num_marks_) {
    return absl::InvalidArgumentError(
        absl::StrCat("timing mark ", id, " outside [0, ", num_marks_, ")"));
  }
  if (!ctx_->device().is_cuda()) {
    return std::chrono::duration_cast<std::chrono::microseconds>(clock_[id] -
                                                                 clock_[0])
        .count();
  }
  ASSIGN_OR_RETURN(const float ms, gpu::ElapsedMs(events_[0], events_[id]));
  return static_cast<int64_t>(std::llround(static_cast<double>(ms) * 1e3));
}

}  // namespace trainyard
