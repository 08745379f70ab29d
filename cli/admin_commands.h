// The commands of whoever runs a cluster: certs (a cluster CA,
// certificates, a tokens file and an admin token), token (a token for a
// user) and health (a daemon's grpc.health.v1 check, e.g. for a probe).
#ifndef TRAINYARD_CLI_ADMIN_COMMANDS_H_
#define TRAINYARD_CLI_ADMIN_COMMANDS_H_

#include "cli/cli_flags.h"

namespace trainyard {

// Exit status: 0 written, 1 writing failed, 2 no --out.
int CertsCommand(const CliFlags& flags);
// Exit status: 0 made (and appended to --tokens_file), 1 appending failed,
// 2 bad flags.
int TokenCommand(const CliFlags& flags);
// Exit status: 0 SERVING, 1 not serving or the check failed, 2 bad flags.
int HealthCommand(const CliFlags& flags);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_ADMIN_COMMANDS_H_
