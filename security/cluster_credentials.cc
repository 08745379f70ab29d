#include "security/cluster_credentials.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/status_macros.h"
#include "security/pki.h"
#include "security/tokens.h"

namespace trainyard {

namespace {

// Where each file goes in `dir`.
ClusterCredentials CredentialPaths(const std::string& dir) {
  ClusterCredentials out;
  out.ca_cert = JoinPath(dir, "ca.pem");
  out.ca_key = JoinPath(dir, "ca.key");
  out.controller_cert = JoinPath(dir, "controller.pem");
  out.controller_key = JoinPath(dir, "controller.key");
  out.worker_cert = JoinPath(dir, "worker.pem");
  out.worker_key = JoinPath(dir, "worker.key");
  out.tokens = JoinPath(dir, "tokens");
  out.admin_token = JoinPath(dir, "admin.token");
  return out;
}

// Creates `dir` readable by its owner only; unless `overwrite`, refuses when
// `ca_cert` already exists.
absl::Status PreparePrivateFolder(const std::string& dir,
                                  const std::string& ca_cert, bool overwrite) {
  struct stat st;
  if (!overwrite && ::stat(ca_cert.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat(ca_cert,
                     ": already exists; not replacing a cluster's CA (pick "
                     "another folder, or remove it first)"));
  }
  RETURN_IF_ERROR(CreateDirectories(dir));
  if (::chmod(dir.c_str(), 0700) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        dir, ": cannot make it private (chmod 0700): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClusterCredentials> WriteClusterCredentials(
    const std::string& dir, const std::vector<std::string>& hosts,
    bool overwrite) {
  ClusterCredentials out = CredentialPaths(dir);
  RETURN_IF_ERROR(PreparePrivateFolder(dir, out.ca_cert, overwrite));

  ASSIGN_OR_RETURN(KeyAndCert ca,
                   NewCertificateAuthority("Trainyard cluster CA",
                                           absl::Hours(24 * 365 * 5)));
  CertificateOptions controller;
  controller.common_name = "trainyard-controller";
  controller.hosts = hosts;
  controller.hosts.push_back("localhost");
  controller.hosts.push_back("127.0.0.1");
  controller.server_auth = true;
  ASSIGN_OR_RETURN(KeyAndCert controller_pem, IssueCertificate(ca, controller));
  CertificateOptions worker;
  worker.common_name = "trainyard-worker";
  worker.hosts = {"localhost", "127.0.0.1"};
  worker.server_auth = true;  // its health port
  worker.client_auth = true;  // towards the controller
  ASSIGN_OR_RETURN(KeyAndCert worker_pem, IssueCertificate(ca, worker));

  out.admin_token_value = NewToken();
  ASSIGN_OR_RETURN(std::string line, TokensFileLine("admin", Role::kAdmin,
                                                    out.admin_token_value));
  RETURN_IF_ERROR(WriteFileAtomically(out.ca_cert, ca.cert_pem));
  RETURN_IF_ERROR(WriteFileAtomically(out.ca_key, ca.key_pem, 0600));
  RETURN_IF_ERROR(
      WriteFileAtomically(out.controller_cert, controller_pem.cert_pem));
  RETURN_IF_ERROR(
      WriteFileAtomically(out.controller_key, controller_pem.key_pem, 0600));
  RETURN_IF_ERROR(WriteFileAtomically(out.worker_cert, worker_pem.cert_pem));
  RETURN_IF_ERROR(
      WriteFileAtomically(out.worker_key, worker_pem.key_pem, 0600));
  RETURN_IF_ERROR(WriteFileAtomically(
      out.tokens,
      absl::StrCat("# user role sha256-of-token (trainyard token "
                   "--user NAME --tokens_file THIS adds one)\n",
                   line),
      0600));
  RETURN_IF_ERROR(WriteFileAtomically(
      out.admin_token, absl::StrCat(out.admin_token_value, "\n"), 0600));
  return out;
}

}  // namespace trainyard
