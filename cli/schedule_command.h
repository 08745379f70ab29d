// `trainyard schedule`: a pipeline schedule as data, simulated. Prints its
// actions, text timeline, per-stage bubble and peak activations (and draws
// the timeline as SVG with --svg). Needs no controller, except to take the
// pass costs from a job's trace (--costs_from).
#ifndef TRAINYARD_CLI_SCHEDULE_COMMAND_H_
#define TRAINYARD_CLI_SCHEDULE_COMMAND_H_

#include "cli/cli_flags.h"

namespace trainyard {

// Exit status: 0 printed, 1 the schedule is invalid, a trace has no passes
// to time or the SVG cannot be written, 2 bad flags (or, with --costs_from,
// ReportRpcError's status).
int ScheduleCommand(const CliFlags& flags);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_SCHEDULE_COMMAND_H_
