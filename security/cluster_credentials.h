// Everything a Trainyard cluster needs to run secure, in one folder: a fresh
// CA, the controller's and the workers' certificates, a tokens file with one
// admin and that admin's token. `trainyard up` makes one per local cluster
// (throw-away); `trainyard certs` makes one for a real deployment (e.g. to
// load into Kubernetes Secrets).
//
// Thread-safe: no shared state.
#ifndef TRAINYARD_SECURITY_CLUSTER_CREDENTIALS_H_
#define TRAINYARD_SECURITY_CLUSTER_CREDENTIALS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainyard {

// Paths of the files written, all inside one folder.
struct ClusterCredentials {
  std::string ca_cert;          // ca.pem: give to every client and worker
  std::string ca_key;           // ca.key: keep offline; signs new certs
  std::string controller_cert;  // controller.pem / controller.key
  std::string controller_key;
  std::string worker_cert;  // worker.pem / worker.key (client + server auth)
  std::string worker_key;
  std::string tokens;             // tokens: the controller's --tokens_file
  std::string admin_token;        // admin.token: the admin's token, one line
  std::string admin_token_value;  // its contents
};

// Writes the files into `dir` (created if needed; keys and tokens 0600).
// The controller certificate names `hosts` plus localhost and 127.0.0.1.
// Unless `overwrite`, AlreadyExists when dir already holds a ca.pem (an
// operator's CA is never replaced by accident).
absl::StatusOr<ClusterCredentials> WriteClusterCredentials(
    const std::string& dir, const std::vector<std::string>& hosts,
    bool overwrite);

}  // namespace trainyard

#endif  // TRAINYARD_SECURITY_CLUSTER_CREDENTIALS_H_
