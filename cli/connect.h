// How a `trainyard` command reaches a daemon: the controller's address, TLS
// and the bearer token from the flags and the environment (README,
// "Security model"), and the one way every command reports a failed call.
#ifndef TRAINYARD_CLI_CONNECT_H_
#define TRAINYARD_CLI_CONNECT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/cli_flags.h"
#include "cli/job_client.h"

namespace trainyard {

// --controller, else $TRAINYARD_CONTROLLER, else 127.0.0.1:7070.
std::string ControllerAddress(const CliFlags& flags);

// The token: --token_file, else $TRAINYARD_TOKEN, else the file named by
// $TRAINYARD_TOKEN_FILE; "" when none is set. InvalidArgument naming the
// flag or variable and the file when the file is unreadable or too large to
// be a token.
absl::StatusOr<std::string> TokenFromFlags(const CliFlags& flags);

// TLS (--insecure, --tls_ca or $TRAINYARD_CA, --tls_server_name) and, over
// TLS only, the token.
absl::StatusOr<JobClientSecurity> SecurityFromFlags(const CliFlags& flags);

// How long a stream keeps trying to reach the controller again (--reconnect_s,
// at least one second).
absl::Duration ReconnectWindow(const CliFlags& flags);

// A client for ControllerAddress with the security flags; null after
// printing "trainyard <command>: <why>" to stderr.
std::unique_ptr<JobClient> Connect(const char* command, const CliFlags& flags);

// Prints a failed call to stderr (with a hint when no controller answers)
// and returns the exit status for it: 2 for a bad request or an unknown
// job, 4 for a missing or refused token, else 3.
int ReportRpcError(const char* command, const JobClient& client,
                   const absl::Status& st);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_CONNECT_H_
