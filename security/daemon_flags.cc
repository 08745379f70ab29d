#include "security/daemon_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "This daemon's TLS certificate (PEM), signed by the cluster CA "
          "(`trainyard certs --out DIR` makes them all): the controller's "
          "server certificate; a worker's client certificate towards the "
          "controller and its health port's server certificate. With "
          "--tls_key and --tls_ca: the secure setup (README, \"Security "
          "model\").");
ABSL_FLAG(std::string, tls_key, "", "Private key of --tls_cert (PEM).");
ABSL_FLAG(std::string, tls_ca, "",
          "The cluster CA (PEM). The controller: workers must present a "
          "client certificate it signed to register. A worker: the "
          "controller's certificate must chain to it.");
ABSL_FLAG(bool, insecure, false,
          "Plaintext gRPC and no authentication: anyone who can reach the "
          "port can submit, see and cancel every job and register as a "
          "worker. Only for a machine nobody else can reach; the controller "
          "and its workers must all use it.");

namespace trainyard {

absl::StatusOr<TlsOptions> DaemonTlsOptionsFromFlags(
    const std::vector<SecurityFlag>& extra, absl::string_view hint) {
  TlsOptions tls;
  tls.insecure = absl::GetFlag(FLAGS_insecure);
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  std::vector<SecurityFlag> flags = {{"--tls_cert", tls.cert_file, true},
                                     {"--tls_key", tls.key_file, true},
                                     {"--tls_ca", tls.ca_file, true}};
  flags.insert(flags.end(), extra.begin(), extra.end());
  absl::Status st = CheckSecurityFlags(tls.insecure, flags, hint);
  if (!st.ok()) return st;
  return tls;
}

}  // namespace trainyard
