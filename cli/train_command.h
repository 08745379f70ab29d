// `trainyard train|infer|eval --spec FILE`: runs the job in this process
// (RunLocalJob), printing a JSON line per step, eval and (infer) output
// shard to stdout (or --metrics_out) and progress to stderr. --device,
// --precision and --stages override the spec's.
#ifndef TRAINYARD_CLI_TRAIN_COMMAND_H_
#define TRAINYARD_CLI_TRAIN_COMMAND_H_

#include <string>

#include "cli/cli_flags.h"

namespace trainyard {

// Exit status: 0 the job ran to its end (or --stop_after_step), 1 it
// failed, 2 bad flags or a spec that is not a valid job.
// `command` ("train", "infer" or "eval") must be the spec's kind.
int LocalJobCommand(const CliFlags& flags, const std::string& command);
int TrainCommand(const CliFlags& flags);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_TRAIN_COMMAND_H_
