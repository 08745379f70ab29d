// StepTracer: times a stage's steps into their reports' phases
// (StageTimes) and traces (StepTrace), engine/stage_report.h.
//
// A span is two marks on the step's StreamTimer (kernels/stream_timer.h),
// resolved into the report's phases and trace once the device has passed
// them: at the end of the step on the CPU; after the step's read on a
// device. What a device stage queues after its read (the all-reduce and the
// update of a multi-stage job) is resolved at the next step's read and
// counted in that step's phases, not its trace. Two timers, used by
// alternate steps, so that a step's carried marks survive the next step's
// Start. An eval is not timed span by span: it is one span on the host
// clock, from the start of the step before it.
//
// Thread safety: used by its stage's thread only.
#ifndef TRAINYARD_ENGINE_STEP_TRACER_H_
#define TRAINYARD_ENGINE_STEP_TRACER_H_

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "engine/stage_report.h"
#include "kernels/exec_context.h"
#include "kernels/stream_timer.h"

namespace trainyard {

class StepTracer {
 public:
  using Clock = std::chrono::steady_clock;

  // `ctx` must outlive the tracer.
  explicit StepTracer(const ExecContext* ctx);
  StepTracer(const StepTracer&) = delete;
  StepTracer& operator=(const StepTracer&) = delete;

  // Starts a step: its spans are recorded until StopTiming, and its start
  // is the origin of the next eval's span.
  absl::Status BeginStep();
  // Records no more spans (the step ended, or failed).
  void StopTiming() { timing_ = false; }
  // Marks the step's read of its device's scalars: every mark before it
  // can be resolved after it.
  void MarkRead() { read_mark_ = Mark(); }
  // Ends the step: stops timing and resolves its spans into `report`, with
  // its duration in report->trace.step_us. With `ends_at_read` (a device
  // stage) the step ends at its read, and the spans after the read are
  // carried into the next step's phases; else it ends now.
  absl::Status EndStep(bool ends_at_read, StepReport* report);

  // The span of an eval that began at `start` and ends now, from the start
  // of the last step; empty when no step began before it.
  std::optional<Span> EvalSpan(Clock::time_point start) const;

 private:
  friend class SpanTimer;
  struct PendingSpan {
    int timer = 0;  // timers_ index
    SpanKind kind = v1::SPAN_FORWARD;
    int microbatch = -1;
    int start = -1, end = -1;             // marks
    double StageTimes::*phase = nullptr;  // may be null
    bool traced = true;
  };

  // A mark on the current step's timer (-1 after an error, kept for
  // Resolve to return).
  int Mark();
  // Resolves the carried spans and the pending ones whose marks are <=
  // `upto` (all for -1) into report; the rest are carried.
  absl::Status Resolve(int upto, StepReport* report);

  std::unique_ptr<StreamTimer> timers_[2];
  int timer_ = 0;        // the current step's
  bool timing_ = false;  // inside a step
  int read_mark_ = -1;   // this step's read, on a device
  std::vector<PendingSpan> pending_;
  std::vector<PendingSpan> carried_;
  absl::Status timing_error_;
  // Where the current (or last) step began on the host clock.
  std::optional<Clock::time_point> step_origin_;
};

// Times one part of a step: a mark before and one after, resolved later
// into `phase` of the step's StageTimes (may be null) and, when `traced`, a
// span of the step's trace. A no-op outside a step.
class SpanTimer {
 public:
  SpanTimer(StepTracer* tracer, double StageTimes::*phase, SpanKind kind,
            int microbatch = -1, bool traced = true);
  ~SpanTimer();
  SpanTimer(const SpanTimer&) = delete;
  SpanTimer& operator=(const SpanTimer&) = delete;

 private:
  StepTracer* const tracer_;
  StepTracer::PendingSpan span_;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_STEP_TRACER_H_
