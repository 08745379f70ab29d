#include "engine/step_tracer.h"

#include <utility>

#include "core/status_macros.h"

namespace trainyard {
namespace {

int64_t Micros(StepTracer::Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

void AddSpan(StepTrace* trace, const Span& span) {
  if (trace->spans.size() >= kMaxSpansPerStep) {
    trace->truncated = true;
    return;
  }
  trace->spans.push_back(span);
}

}  // namespace

StepTracer::StepTracer(const ExecContext* ctx) {
  for (auto& timer : timers_) timer = std::make_unique<StreamTimer>(ctx);
}

absl::Status StepTracer::BeginStep() {
  step_origin_ = Clock::now();
  timer_ ^= 1;  // the other timer may hold the last step's carried marks
  RETURN_IF_ERROR(timers_[timer_]->Start());
  timing_ = true;
  read_mark_ = -1;
  return absl::OkStatus();
}

absl::Status StepTracer::EndStep(bool ends_at_read, StepReport* report) {
  // The step's device timeline ends at its read (device stages; what came
  // after it is resolved at the next step's), or now (the CPU).
  const int end_mark = ends_at_read ? read_mark_ : Mark();
  timing_ = false;
  RETURN_IF_ERROR(Resolve(ends_at_read ? read_mark_ : -1, report));
  if (end_mark >= 0) {
    ASSIGN_OR_RETURN(report->trace.step_us, timers_[timer_]->Micros(end_mark));
  }
  return absl::OkStatus();
}

std::optional<Span> StepTracer::EvalSpan(Clock::time_point start) const {
  if (!step_origin_.has_value()) return std::nullopt;
  return Span{v1::SPAN_EVAL, -1, Micros(start - *step_origin_),
              Micros(Clock::now() - *step_origin_)};
}

int StepTracer::Mark() {
  absl::StatusOr<int> id = timers_[timer_]->Mark();
  if (!id.ok()) {
    if (timing_error_.ok()) timing_error_ = id.status();
    return -1;
  }
  return *id;
}

absl::Status StepTracer::Resolve(int upto, StepReport* report) {
  RETURN_IF_ERROR(std::exchange(timing_error_, absl::OkStatus()));
  auto micros = [this](int timer, int id) {
    return timers_[timer]->Micros(id);
  };
  // The previous step's spans queued after its read: complete now, counted
  // in this step's phases (they are not in any trace).
  for (const PendingSpan& p : carried_) {
    ASSIGN_OR_RETURN(const int64_t start, micros(p.timer, p.start));
    ASSIGN_OR_RETURN(const int64_t end, micros(p.timer, p.end));
    if (p.phase != nullptr) report->times.*p.phase += (end - start) * 1e-6;
  }
  carried_.clear();
  for (const PendingSpan& p : pending_) {
    if (upto >= 0 && p.end > upto) {
      carried_.push_back(p);
      continue;
    }
    ASSIGN_OR_RETURN(const int64_t start, micros(p.timer, p.start));
    ASSIGN_OR_RETURN(const int64_t end, micros(p.timer, p.end));
    if (p.phase != nullptr) report->times.*p.phase += (end - start) * 1e-6;
    if (p.traced) AddSpan(&report->trace, {p.kind, p.microbatch, start, end});
  }
  pending_.clear();
  return absl::OkStatus();
}

SpanTimer::SpanTimer(StepTracer* tracer, double StageTimes::*phase,
                     SpanKind kind, int microbatch, bool traced)
    : tracer_(tracer), span_{tracer->timer_, kind,  microbatch, -1, -1,
                             phase,          traced} {
  if (tracer_->timing_) span_.start = tracer_->Mark();
}

SpanTimer::~SpanTimer() {
  if (!tracer_->timing_ || span_.start < 0) return;
  span_.end = tracer_->Mark();
  if (span_.end >= 0) tracer_->pending_.push_back(span_);
}

}  // namespace trainyard
