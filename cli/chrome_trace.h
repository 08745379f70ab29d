// One step's pipeline trace (JobService.GetTrace) as Chrome trace-event
// JSON: the {"traceEvents": [...]} object chrome://tracing and Perfetto
// (ui.perfetto.dev) load.
//
// Layout: one process per stage (pid = stage, named "stage K (worker)"),
// one thread per kind of span (the lanes below), and every span a complete
// ("X") event with ts/dur in microseconds, named as the schedules print
// actions ("F3" forward of microbatch 3, "L3" its loss, "B3" input and
// "W3" weight gradient, ">A3"/">G3" sends, "<A3"/"<G3" waits for a
// receive), with the microbatch in args. Lane 0 holds one "step N" event
// per stage from its step start to its end.
//
// Clocks: each stage's events are timed from its own start of the step
// (the stages' clocks are not synchronised), so every stage's timeline
// starts at 0: a wait on one stage lines up with the matching send on its
// neighbour only roughly.
#ifndef TRAINYARD_CLI_CHROME_TRACE_H_
#define TRAINYARD_CLI_CHROME_TRACE_H_

#include <string>

#include "proto/trainyard.pb.h"

namespace trainyard {

// The lanes (Chrome "tid"s) of a stage.
enum ChromeTraceLane {
  kLaneStep = 0,
  kLanePrepare = 1,
  kLaneForward = 2,
  kLaneLoss = 3,
  kLaneBackwardInput = 4,
  kLaneBackwardWeight = 5,
  kLaneSend = 6,
  kLaneRecvWait = 7,
  kLaneAllReduce = 8,
  kLaneOptimizer = 9,
  kLaneEval = 10,
  kLaneDataWait = 11,
};

// The event name of a span: "F3", ">A3", "all-reduce", ...
std::string SpanEventName(const v1::StageSpan& span);

// The whole trace file (compact JSON, ends with a newline).
std::string ChromeTraceJson(const v1::GetTraceResponse& trace);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_CHROME_TRACE_H_
