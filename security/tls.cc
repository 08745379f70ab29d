#include "security/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file_util.h"

namespace trainyard {
namespace {

// PEM files are small; anything bigger is not one.
constexpr int64_t kMaxPemBytes = 1 << 20;

absl::StatusOr<std::string> ReadPem(const std::string& flag,
                                    const std::string& path) {
  auto size = FileSize(path);
  if (!size.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": ", size.status().message()));
  }
  if (*size > kMaxPemBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " ", path, ": ", *size, " bytes; not a PEM file"));
  }
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": ", text.status().message()));
  }
  return text;
}

// Checks that `cert_pem` holds at least one certificate, `key_pem` a private
// key (when given), and that they match: gRPC would otherwise fail later,
// at the first handshake, with a vaguer message.
absl::Status CheckPem(const std::string& cert_flag,
                      const std::string& cert_path, const std::string& cert_pem,
                      const std::string& key_path, const std::string* key_pem) {
  BIO* bio =
      BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  absl::Status st;
  if (cert == nullptr) {
    st = absl::InvalidArgumentError(absl::StrCat(
        "--", cert_flag, " ", cert_path, ": no PEM certificate in it"));
  } else if (key_pem != nullptr) {
    bio = BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size()));
    EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    if (key == nullptr) {
      st = absl::InvalidArgumentError(
          absl::StrCat("--tls_key ", key_path, ": no PEM private key in it"));
    } else if (X509_check_private_key(cert, key) != 1) {
      st = absl::InvalidArgumentError(absl::StrCat(
          "--tls_key ", key_path,
          ": does not match the certificate in --tls_cert ", cert_path));
    }
    EVP_PKEY_free(key);
  }
  X509_free(cert);
  ERR_clear_error();
  return st;
}

struct Pems {
  std::string cert, key, ca;
};

absl::StatusOr<Pems> ReadPems(const TlsOptions& options) {
  Pems pems;
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: give both or neither");
  }
  if (!options.cert_file.empty()) {
    auto cert = ReadPem("tls_cert", options.cert_file);
    if (!cert.ok()) return cert.status();
    auto key = ReadPem("tls_key", options.key_file);
    if (!key.ok()) return key.status();
    absl::Status st =
        CheckPem("tls_cert", options.cert_file, *cert, options.key_file, &*key);
    if (!st.ok()) return st;
    pems.cert = *std::move(cert);
    pems.key = *std::move(key);
  }
  if (!options.ca_file.empty()) {
    auto ca = ReadPem("tls_ca", options.ca_file);
    if (!ca.ok()) return ca.status();
    absl::Status st = CheckPem("tls_ca", options.ca_file, *ca, "", nullptr);
    if (!st.ok()) return st;
    pems.ca = *std::move(ca);
  }
  return pems;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options) {
  if (options.insecure) return grpc::InsecureServerCredentials();
  if (options.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs --tls_cert and --tls_key (or --insecure for plaintext)");
  }
  auto pems = ReadPems(options);
  if (!pems.ok()) return pems.status();
  grpc::SslServerCredentialsOptions ssl(
      pems->ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                       : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = pems->ca;
  ssl.pem_key_cert_pairs.push_back({pems->key, pems->cert});
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const TlsOptions& options,
                       grpc::ChannelArguments* args) {
  if (options.insecure) return grpc::InsecureChannelCredentials();
  auto pems = ReadPems(options);
  if (!pems.ok()) return pems.status();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = pems->ca;
  ssl.pem_private_key = pems->key;
  ssl.pem_cert_chain = pems->cert;
  if (!options.server_name.empty()) {
    args->SetSslTargetNameOverride(options.server_name);
  }
  return grpc::SslCredentials(ssl);
}

bool PeerHasVerifiedCertificate(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return false;
  std::vector<grpc::string_ref> type =
      auth->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME);
  if (type.empty() || type[0] != GRPC_SSL_TRANSPORT_SECURITY_TYPE) return false;
  // With REQUEST_CLIENT_CERTIFICATE_AND_VERIFY a presented certificate that
  // does not verify fails the handshake, so one that is here verified.
  return !auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME).empty();
}

std::string PeerCommonName(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return "";
  std::vector<grpc::string_ref> cn =
      auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  return cn.empty() ? "" : std::string(cn[0].data(), cn[0].size());
}

absl::Status CheckSecurityFlags(bool insecure,
                                const std::vector<SecurityFlag>& flags,
                                absl::string_view hint) {
  std::vector<std::string> all, required;
  bool any_set = false, missing = false;
  for (const SecurityFlag& f : flags) {
    all.push_back(f.name);
    any_set |= !f.value.empty();
    if (f.required) {
      required.push_back(f.name);
      missing |= f.value.empty();
    }
  }
  auto list = [](const std::vector<std::string>& names, const char* last) {
    if (names.size() <= 1) return absl::StrJoin(names, "");
    return absl::StrCat(absl::StrJoin(names.begin(), names.end() - 1, ", "),
                        " ", last, " ", names.back());
  };
  if (insecure && any_set) {
    return absl::InvalidArgumentError(
        absl::StrCat("--insecure cannot be combined with ", list(all, "or")));
  }
  if (!insecure && missing) {
    return absl::InvalidArgumentError(
        absl::StrCat("secure by default: give ", list(required, "and"), " (",
                     hint, "), or --insecure for plaintext"));
  }
  return absl::OkStatus();
}

}  // namespace trainyard
