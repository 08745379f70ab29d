// What a stage reports about one training step or eval pass: the phases'
// times, the step's trace of spans, the loss, norm and metrics.
//
// A header of its own so that a reader of reports (the CLI, the worker)
// needs neither the engine's header graph nor its libraries.
#ifndef TRAINYARD_ENGINE_STAGE_REPORT_H_
#define TRAINYARD_ENGINE_STAGE_REPORT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/device_traffic.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

// Seconds spent in each phase of one step, per stage.
struct StageTimes {
  double forward = 0;
  double backward = 0;   // backward-input + backward-weight
  double comm = 0;       // sends, all-reduce
  double idle = 0;       // waiting to receive (the pipeline bubble)
  double optimizer = 0;  // norm, clip and update
  double loss = 0;       // the last stage's loss head (task plugin, copies)
  // The first stage: waiting for the batch's rows (read ahead by a
  // BatchReader, or gathered then).
  double data_wait = 0;
};

// What a stage was doing during one span of a step: the wire's
// v1::SpanKind. Each kind is timed where StageTimes' phases are:
// DATA_WAIT in data_wait; PREPARE_BATCH in none; FORWARD in forward; LOSS in loss; BACKWARD_INPUT
// and BACKWARD_WEIGHT in backward; SEND_* and ALL_REDUCE in comm; RECV_*
// in idle (waiting for a neighbour); OPTIMIZER in optimizer; EVAL in none.
using SpanKind = v1::SpanKind;

struct Span {
  SpanKind kind = v1::SPAN_FORWARD;
  int microbatch = -1;  // -1: not about one microbatch
  // Microseconds from the start of the step (RunStep's start) on this
  // stage's monotonic clock.
  int64_t start_us = 0;
  int64_t end_us = 0;
};

// The spans of one step on one stage, in the order they happened: every
// action of the stage's schedule (its receives as the wait for the
// message), then the optimizer's parts. Spans never overlap (one thread
// does them) and lie within [0, step_us].
struct StepTrace {
  std::vector<Span> spans;
  int64_t step_us = 0;     // RunStep's duration
  bool truncated = false;  // more than kMaxSpansPerStep; the rest are lost
};
inline constexpr size_t kMaxSpansPerStep = 4096;

struct StepReport {
  int64_t step = 0;      // 1-based number of the step just completed
  double loss = 0;       // sum(w L) / sum(w); known on every stage
  double lr = 0;         // learning rate used for this step
  double grad_norm = 0;  // global L2 norm before clipping
  int64_t samples = 0;   // rows in the batch
  // The task plugin's metrics (last stage only).
  std::vector<std::pair<std::string, double>> metrics;
  StageTimes times;
  // Stages that reported their file of the pending checkpoint written
  // (Stage::set_checkpoint_file_written), summed by the step's all-reduce.
  int checkpoint_files_written = 0;
  StepTrace trace;
  // The stage's host<->device copies and synchronisations during the step
  // (zero on the CPU; see ExecContext::traffic).
  DeviceTraffic traffic;
};

struct EvalReport {
  double loss = 0;
  int64_t samples = 0;
  std::vector<std::pair<std::string, double>> metrics;  // last stage only
  // The whole pass as a SPAN_EVAL span, timed from the start of the step it
  // follows; empty when no step ran before it on this stage.
  std::optional<Span> span;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_STAGE_REPORT_H_
