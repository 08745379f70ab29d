// StreamTimer: when a step's work ran on its stage's device. Mark() records
// a point in the order of the context's stream — a CUDA event on a GPU; on
// the CPU and the simulated device, whose work runs as it is queued, the
// host clock — and Micros() gives a mark's time since the step's origin
// (Start) once the device has passed it (after a synchronisation). A span
// between two marks is the device time of the work queued between them,
// including time the device sat idle waiting for that work (a pipeline
// bubble shows up in the span of the receive that caused it).
//
// Stages that share a GPU share its stream (kernels/exec_context.h), so one
// stage's span can include another stage's kernels queued in between.
//
// Thread safety: used by one thread.
#ifndef TRAINYARD_KERNELS_STREAM_TIMER_H_
#define TRAINYARD_KERNELS_STREAM_TIMER_H_

#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/exec_context.h"

struct CUevent_st;

namespace trainyard {

class StreamTimer {
 public:
  // `ctx` must outlive the timer.
  explicit StreamTimer(const ExecContext* ctx) : ctx_(ctx) {}
  ~StreamTimer();
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;

  // Starts a step: forgets the marks and records mark 0, the origin.
  absl::Status Start();
  // Records a point on the stream; returns its number. Errors: a CUDA
  // failure, or more than kMaxMarks marks in a step (ResourceExhausted).
  absl::StatusOr<int> Mark();
  // Microseconds from the origin to mark `id`. Errors: an unknown mark; on
  // a GPU, a mark the device has not reached yet.
  absl::StatusOr<int64_t> Micros(int id) const;
  int marks() const { return num_marks_; }

  static constexpr int kMaxMarks = 16384;

 private:
  using Clock = std::chrono::steady_clock;
  const ExecContext* ctx_;
  int num_marks_ = 0;
  std::vector<Clock::time_point> clock_;  // host clock: one per mark
  std::vector<CUevent_st*> events_;       // GPU: a pool, reused each step
};

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_STREAM_TIMER_H_
