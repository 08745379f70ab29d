// `trainyard up`: a local cluster (LocalCluster: a controller and
// --workers workers as child processes, TLS and tokens on unless
// --insecure) that runs until Ctrl-C, or, with --run FILE, runs that one
// job to its end, prints its final eval and stops.
#ifndef TRAINYARD_CLI_UP_COMMAND_H_
#define TRAINYARD_CLI_UP_COMMAND_H_

#include "cli/cli_flags.h"

namespace trainyard {

// Installs SIGINT and SIGTERM handlers that stop the cluster. Exit status:
// 0 stopped by a signal, or the --run job SUCCEEDED; 1 the cluster failed
// (or was interrupted during --run) or the job ended otherwise; 2 bad flags
// or a bad --run spec; ReportRpcError's status when a call to the
// controller failed.
int UpCommand(const CliFlags& flags);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_UP_COMMAND_H_
