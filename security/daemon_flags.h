// The TLS command-line flags both daemons (trainyard-controller and
// trainyard-worker) take, defined once: --tls_cert, --tls_key, --tls_ca and
// --insecure.
#ifndef TRAINYARD_SECURITY_DAEMON_FLAGS_H_
#define TRAINYARD_SECURITY_DAEMON_FLAGS_H_

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "security/tls.h"

ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(bool, insecure);

namespace trainyard {

// TlsOptions from the flags, checked with CheckSecurityFlags: --insecure
// and none of the security flags, or all the required ones. `extra` are
// the daemon's own security flags (the controller's --tokens_file, the
// worker's --tls_server_name); `hint` says where the files come from.
absl::StatusOr<TlsOptions> DaemonTlsOptionsFromFlags(
    const std::vector<SecurityFlag>& extra, absl::string_view hint);

}  // namespace trainyard

#endif  // TRAINYARD_SECURITY_DAEMON_FLAGS_H_
