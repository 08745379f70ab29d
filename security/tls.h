// gRPC credentials from PEM files, one place for every daemon and client:
// the controller's port (TLS; worker client certificates verified against
// the cluster CA), a worker's health port and its channel to the controller
// (mTLS), and the CLI's channel (TLS; the user authenticates with a token,
// not a certificate).
//
// Thread-safe: no shared state.
#ifndef TRAINYARD_SECURITY_TLS_H_
#define TRAINYARD_SECURITY_TLS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace trainyard {

struct TlsOptions {
  // Plaintext: no TLS at all. Must be asked for explicitly (--insecure);
  // the daemons log a warning.
  bool insecure = false;
  std::string cert_file;  // our certificate (PEM); a server needs one
  std::string key_file;   // its private key (PEM)
  // Server: the CA whose signature a client certificate needs (clients
  // without one may still connect; RequireVerifiedPeer decides per call).
  // Client: the CA the server's certificate must chain to; empty = the
  // system's roots.
  std::string ca_file;
  // Client: the name checked against the server certificate instead of the
  // dialed host (e.g. the controller's Service name when dialing an IP).
  std::string server_name;
};

// InvalidArgument naming the flag and file when a file is missing, is not
// PEM, or the key does not match the certificate. A server without
// insecure needs cert_file and key_file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options);

// `args` gets the target-name override when server_name is set.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsOptions& options, grpc::ChannelArguments* args);

// Whether the call's peer presented a client certificate that the server's
// CA verified (always false on a plaintext port).
bool PeerHasVerifiedCertificate(const grpc::ServerContextBase& context);

// The peer certificate's common name, or "" (for logs).
std::string PeerCommonName(const grpc::ServerContextBase& context);

// One security flag of a daemon, as given on its command line.
struct SecurityFlag {
  const char* name;  // "--tls_cert"
  std::string value;
  bool required;  // for the secure setup
};

// A daemon is secure by default: either `insecure` with none of `flags`,
// or every required flag set. InvalidArgument saying which, `hint` telling
// where the files come from.
absl::Status CheckSecurityFlags(bool insecure,
                                const std::vector<SecurityFlag>& flags,
                                absl::string_view hint);

}  // namespace trainyard

#endif  // TRAINYARD_SECURITY_TLS_H_
