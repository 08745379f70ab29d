// A small certificate authority for a Trainyard cluster (OpenSSL): a CA and
// the certificates it signs for the controller (TLS server) and the workers
// (TLS client towards the controller, TLS server on their health port).
// `trainyard up` and `trainyard certs` use it; operators with their own PKI
// need none of it (the daemons take any PEM files).
//
// Keys are ECDSA P-256; certificates X.509 v3 signed with SHA-256, PEM.
//
// Thread-safe: no shared state.
#ifndef TRAINYARD_SECURITY_PKI_H_
#define TRAINYARD_SECURITY_PKI_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainyard {

struct KeyAndCert {
  std::string key_pem;  // PKCS#8, unencrypted: keep the file 0600
  std::string cert_pem;
};

struct CertificateOptions {
  std::string common_name;
  // subjectAltName entries: dotted IPv4 addresses become IP entries,
  // anything else a DNS entry. gRPC checks the name a client dials against
  // them.
  std::vector<std::string> hosts;
  bool server_auth = false;  // extendedKeyUsage serverAuth
  bool client_auth = false;  // extendedKeyUsage clientAuth
  absl::Duration validity = absl::Hours(24 * 365);
};

// A self-signed CA certificate (basicConstraints CA:TRUE, keyCertSign).
absl::StatusOr<KeyAndCert> NewCertificateAuthority(
    const std::string& common_name, absl::Duration validity);

// A leaf certificate for `options`, signed by `ca`. InvalidArgument when
// `ca` does not parse or its key does not match its certificate, or when
// `options` has no common name.
absl::StatusOr<KeyAndCert> IssueCertificate(const KeyAndCert& ca,
                                            const CertificateOptions& options);

}  // namespace trainyard

#endif  // TRAINYARD_SECURITY_PKI_H_
