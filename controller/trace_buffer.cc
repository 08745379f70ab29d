#include "controller/trace_buffer.h"

#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainyard {

TraceBuffer::TraceBuffer(int num_ranks, TraceLimits limits)
    : num_ranks_(num_ranks), limits_(limits) {}

void TraceBuffer::Sanitize(v1::StageTrace* trace) const {
  auto* spans = trace->mutable_spans();
  int kept = 0;
  for (int i = 0; i < spans->size(); ++i) {
    const v1::StageSpan& s = spans->Get(i);
    if (s.start_us() < 0 || s.end_us() < s.start_us()) continue;
    if (kept >= limits_.max_spans) {
      trace->set_truncated(true);
      break;
    }
    if (kept != i) spans->SwapElements(kept, i);
    ++kept;
  }
  spans->DeleteSubrange(kept, spans->size() - kept);
}

void TraceBuffer::AddStep(int64_t step, int attempt, v1::StageTrace trace) {
  if (step <= 0 || trace.stage() < 0 || trace.stage() >= num_ranks_) return;
  StepEntry& e = steps_[step];
  if (attempt < e.attempt) return;
  if (attempt > e.attempt) {
    // A restarted gang recomputed the step: the old gang's traces go.
    bytes_ -= e.bytes;
    e = StepEntry();
    e.attempt = attempt;
  }
  Sanitize(&trace);
  const size_t size = trace.ByteSizeLong();
  auto [it, inserted] = e.stages.try_emplace(trace.stage());
  if (!inserted) {
    const size_t old = it->second.ByteSizeLong();
    e.bytes -= old;
    bytes_ -= old;
  }
  it->second = std::move(trace);
  e.bytes += size;
  bytes_ += size;
  Evict();
}

void TraceBuffer::AddEval(int64_t step, int attempt,
                          const v1::StageTrace& trace) {
  auto it = steps_.find(step);
  if (it == steps_.end() || it->second.attempt != attempt) return;
  StepEntry& e = it->second;
  auto stage = e.stages.find(trace.stage());
  if (stage == e.stages.end()) return;
  v1::StageTrace& held = stage->second;
  const size_t before = held.ByteSizeLong();
  for (const v1::StageSpan& s : trace.spans()) {
    if (s.start_us() < 0 || s.end_us() < s.start_us()) continue;
    if (held.spans_size() >= limits_.max_spans) {
      held.set_truncated(true);
      break;
    }
    *held.add_spans() = s;
  }
  const size_t after = held.ByteSizeLong();
  e.bytes += after - before;
  bytes_ += after - before;
  Evict();
}

void TraceBuffer::Evict() {
  while (!steps_.empty() &&
         (static_cast<int64_t>(steps_.size()) > limits_.max_steps ||
          bytes_ > limits_.max_bytes)) {
    bytes_ -= steps_.begin()->second.bytes;
    steps_.erase(steps_.begin());
  }
}

absl::StatusOr<v1::GetTraceResponse> TraceBuffer::Get(const std::string& job_id,
                                                      int64_t step) const {
  if (steps_.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "job ", job_id,
        ": no step traces held (none reported yet, or the controller "
        "restarted since; traces are kept in memory only)"));
  }
  const int64_t oldest = steps_.begin()->first;
  const int64_t newest = steps_.rbegin()->first;
  auto found = steps_.end();
  if (step == 0) {
    for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) {
      if (static_cast<int>(it->second.stages.size()) == num_ranks_) {
        found = std::prev(it.base());
        break;
      }
    }
    if (found == steps_.end()) found = std::prev(steps_.end());
  } else {
    found = steps_.find(step);
  }
  if (found == steps_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "job ", job_id, ": step ", step, " is not held; steps ", oldest, "..",
        newest, " are (the controller keeps the traces of a job's newest ",
        limits_.max_steps, " steps, in memory only)"));
  }
  v1::GetTraceResponse out;
  out.set_job_id(job_id);
  out.set_step(found->first);
  out.set_num_stages(num_ranks_);
  out.set_oldest_step(oldest);
  out.set_newest_step(newest);
  for (const auto& [stage, trace] : found->second.stages) {
    *out.add_stages() = trace;
  }
  return out;
}

}  // namespace trainyard
