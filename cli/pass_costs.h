// The pass costs `trainyard schedule` simulates a schedule with: parsed
// from --costs, or measured from a job's traced step (--costs_from).
#ifndef TRAINYARD_CLI_PASS_COSTS_H_
#define TRAINYARD_CLI_PASS_COSTS_H_

#include <optional>
#include <string>

#include "proto/trainyard.pb.h"
#include "schedule/schedule.h"

namespace trainyard {

// --costs "F,B,W": three finite times >= 0, not all 0; nullopt otherwise.
std::optional<PassCosts> ParseCosts(const std::string& text);

// Whole-stage costs per microbatch (ms) from a step's spans: a stage with v
// chunks has v spans of each kind per microbatch, so each kind's time is
// divided by the microbatches it ran (chained weight passes, one span of
// microbatch -1, by those it ran forward). nullopt when the step has no
// forward, input- or weight-gradient span.
std::optional<PassCosts> MeanPassCosts(
    const trainyard::v1::GetTraceResponse& trace);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_PASS_COSTS_H_
