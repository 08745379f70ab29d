// TraceBuffer: the span traces (v1::StageTrace) of a job's newest steps, as
// its stages report them, for JobService.GetTrace. In memory only: a
// restarted controller holds the steps reported after its start.
//
// Bounded two ways: at most `max_steps` steps and `max_bytes` of traces
// (serialized size); the oldest steps go first. One stage's trace of a step
// holds at most `max_spans` spans (more are cut, and the trace is marked
// truncated), so a single report cannot push every other step out.
//
// A restarted gang recomputes steps: a trace from a newer attempt replaces
// every older attempt's traces of that step, so one step never mixes
// gangs.
//
// With replicas, each rank of the gang (stages x replicas) reports its own
// trace: StageTrace.stage carries the rank, and "stage" below means it.
//
// Thread safety: none; the JobManager guards it with its lock.
#ifndef TRAINYARD_CONTROLLER_TRACE_BUFFER_H_
#define TRAINYARD_CONTROLLER_TRACE_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

struct TraceLimits {
  int64_t max_steps = 256;
  size_t max_bytes = size_t{4} << 20;
  int max_spans = 4096;  // per stage and step
};

class TraceBuffer {
 public:
  TraceBuffer(int num_ranks, TraceLimits limits = {});

  // Records `trace` (its stage in [0, num_ranks)) as that stage's trace of
  // `step`, measured by the job's gang `attempt`. Traces of a stage out of
  // range, of a step <= 0, or from an older attempt than the step's are
  // dropped; spans with start_us < 0 or end_us < start_us are dropped.
  void AddStep(int64_t step, int attempt, v1::StageTrace trace);
  // Appends the spans of `trace` (the eval pass after `step`) to that
  // stage's trace of `step`, when it is held and of the same attempt.
  void AddEval(int64_t step, int attempt, const v1::StageTrace& trace);

  // Every stage's trace of `step`; step 0: the newest step every stage has
  // reported (else the newest step). NotFound naming `job_id`, the step
  // and the steps held.
  absl::StatusOr<v1::GetTraceResponse> Get(const std::string& job_id,
                                           int64_t step) const;

  size_t bytes() const { return bytes_; }
  int64_t steps() const { return static_cast<int64_t>(steps_.size()); }

 private:
  struct StepEntry {
    int attempt = 0;
    std::map<int, v1::StageTrace> stages;
    size_t bytes = 0;
  };
  // Drops the oldest steps until both limits hold.
  void Evict();
  // Cuts `trace` to the span limit and drops malformed spans.
  void Sanitize(v1::StageTrace* trace) const;

  const int num_ranks_;
  const TraceLimits limits_;
  std::map<int64_t, StepEntry> steps_;
  size_t bytes_ = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_TRACE_BUFFER_H_
