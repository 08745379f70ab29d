// The client commands: submit, get, list, cancel, watch, workers, logs and
// trace, each a call (or a stream) to the controller at --controller
// (cli/connect.h). `args` is the command line left after the flags:
// args[1] is the command, args[2] the job id.
//
// Each returns the process's exit status: 0 success (watch and
// submit --watch: the job SUCCEEDED), 1 a failure while running or a job
// that ended FAILED or CANCELLED, 2 bad usage or a bad spec, 3 the
// controller could not be reached or refused the call, 4 a missing or
// refused token.
#ifndef TRAINYARD_CLI_CLIENT_COMMANDS_H_
#define TRAINYARD_CLI_CLIENT_COMMANDS_H_

#include <vector>

#include "cli/cli_flags.h"

namespace trainyard {

int SubmitCommand(const CliFlags& flags);
int GetCommand(const CliFlags& flags, const std::vector<char*>& args);
int ListCommand(const CliFlags& flags);
int CancelCommand(const CliFlags& flags, const std::vector<char*>& args);
int WatchCommand(const CliFlags& flags, const std::vector<char*>& args);
int WorkersCommand(const CliFlags& flags);
int LogsCommand(const CliFlags& flags, const std::vector<char*>& args);
int TraceCommand(const CliFlags& flags, const std::vector<char*>& args);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_CLIENT_COMMANDS_H_
