#include "security/pki.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainyard {
namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using CertPtr = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using BioPtr = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using ExtPtr = std::unique_ptr<X509_EXTENSION,
                               Deleter<X509_EXTENSION, X509_EXTENSION_free>>;
using BnPtr = std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>>;

// The newest OpenSSL error as text, for messages ("what: reason").
absl::Status OpenSslError(const std::string& what) {
  char buf[256] = "unknown error";
  const unsigned long code = ERR_get_error();
  if (code != 0) ERR_error_string_n(code, buf, sizeof(buf));
  ERR_clear_error();
  return absl::InternalError(absl::StrCat(what, ": OpenSSL: ", buf));
}

absl::StatusOr<KeyPtr> NewKey() {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("generate a P-256 key");
  return key;
}

absl::StatusOr<std::string> BioText(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  if (n <= 0) return OpenSslError("encode PEM");
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<KeyAndCert> ToPem(EVP_PKEY* key, X509* cert) {
  BioPtr key_bio(BIO_new(BIO_s_mem()));
  BioPtr cert_bio(BIO_new(BIO_s_mem()));
  if (key_bio == nullptr || cert_bio == nullptr ||
      PEM_write_bio_PrivateKey(key_bio.get(), key, nullptr, nullptr, 0, nullptr,
                               nullptr) != 1 ||
      PEM_write_bio_X509(cert_bio.get(), cert) != 1) {
    return OpenSslError("encode PEM");
  }
  KeyAndCert out;
  auto key_pem = BioText(key_bio.get());
  if (!key_pem.ok()) return key_pem.status();
  auto cert_pem = BioText(cert_bio.get());
  if (!cert_pem.ok()) return cert_pem.status();
  out.key_pem = *std::move(key_pem);
  out.cert_pem = *std::move(cert_pem);
  return out;
}

// Adds one extension in OpenSSL's config syntax ("critical,CA:TRUE").
absl::Status AddExtension(X509* cert, X509* issuer, int nid,
                          const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  ExtPtr ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (ext == nullptr || X509_add_ext(cert, ext.get(), -1) != 1) {
    return OpenSslError(
        absl::StrCat("certificate extension ", OBJ_nid2sn(nid), "=", value));
  }
  return absl::OkStatus();
}

// A certificate for `key` named `common_name`, valid from an hour ago (for
// clocks a little behind) for `validity`, with a random 127-bit serial. Not
// yet signed; `issuer` null means self-issued.
absl::StatusOr<CertPtr> NewCert(EVP_PKEY* key, const std::string& common_name,
                                X509* issuer, absl::Duration validity) {
  CertPtr cert(X509_new());
  BnPtr serial(BN_new());
  if (cert == nullptr || serial == nullptr ||
      X509_set_version(cert.get(), 2) != 1 ||
      BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) ==
          nullptr ||
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()),
                      absl::ToInt64Seconds(validity)) == nullptr ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return OpenSslError("make certificate");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(
          name, "O", MBSTRING_UTF8,
          reinterpret_cast<const unsigned char*>("Trainyard"), -1, -1,
          0) != 1 ||
      X509_NAME_add_entry_by_txt(
          name, "CN", MBSTRING_UTF8,
          reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
          0) != 1 ||
      X509_set_issuer_name(
          cert.get(),
          issuer == nullptr ? name : X509_get_subject_name(issuer)) != 1) {
    return OpenSslError(absl::StrCat("certificate name \"", common_name, "\""));
  }
  return cert;
}

absl::StatusOr<KeyPtr> ParseKey(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("CA key: not a PEM private key");
  }
  return key;
}

absl::StatusOr<CertPtr> ParseCert(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  CertPtr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("CA certificate: not a PEM certificate");
  }
  return cert;
}

bool IsIpv4(const std::string& host) {
  in_addr addr;
  return inet_pton(AF_INET, host.c_str(), &addr) == 1;
}

}  // namespace

absl::StatusOr<KeyAndCert> NewCertificateAuthority(
    const std::string& common_name, absl::Duration validity) {
  auto key = NewKey();
  if (!key.ok()) return key.status();
  auto cert = NewCert(key->get(), common_name, nullptr, validity);
  if (!cert.ok()) return cert.status();
  X509* c = cert->get();
  for (auto [nid, value] :
       {std::pair<int, const char*>{NID_basic_constraints, "critical,CA:TRUE"},
        {NID_key_usage, "critical,keyCertSign,cRLSign"},
        {NID_subject_key_identifier, "hash"}}) {
    absl::Status st = AddExtension(c, c, nid, value);
    if (!st.ok()) return st;
  }
  if (X509_sign(c, key->get(), EVP_sha256()) <= 0) {
    return OpenSslError("sign the CA certificate");
  }
  return ToPem(key->get(), c);
}

absl::StatusOr<KeyAndCert> IssueCertificate(const KeyAndCert& ca,
                                            const CertificateOptions& options) {
  if (options.common_name.empty()) {
    return absl::InvalidArgumentError("certificate: common_name is required");
  }
  auto ca_key = ParseKey(ca.key_pem);
  if (!ca_key.ok()) return ca_key.status();
  auto ca_cert = ParseCert(ca.cert_pem);
  if (!ca_cert.ok()) return ca_cert.status();
  if (X509_check_private_key(ca_cert->get(), ca_key->get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        "CA key: does not match the CA certificate");
  }
  auto key = NewKey();
  if (!key.ok()) return key.status();
  auto cert = NewCert(key->get(), options.common_name, ca_cert->get(),
                      options.validity);
  if (!cert.ok()) return cert.status();
  X509* c = cert->get();
  std::vector<std::string> usages;
  if (options.server_auth) usages.push_back("serverAuth");
  if (options.client_auth) usages.push_back("clientAuth");
  std::vector<std::string> names;
  for (const std::string& host : options.hosts) {
    names.push_back(absl::StrCat(IsIpv4(host) ? "IP:" : "DNS:", host));
  }
  std::vector<std::pair<int, std::string>> extensions = {
      {NID_basic_constraints, "critical,CA:FALSE"},
      {NID_key_usage, "critical,digitalSignature"},
      {NID_subject_key_identifier, "hash"},
      {NID_authority_key_identifier, "keyid"}};
  if (!usages.empty()) {
    extensions.push_back({NID_ext_key_usage, absl::StrJoin(usages, ",")});
  }
  if (!names.empty()) {
    extensions.push_back({NID_subject_alt_name, absl::StrJoin(names, ",")});
  }
  for (const auto& [nid, value] : extensions) {
    absl::Status st = AddExtension(c, ca_cert->get(), nid, value);
    if (!st.ok()) return st;
  }
  if (X509_sign(c, ca_key->get(), EVP_sha256()) <= 0) {
    return OpenSslError(
        absl::StrCat("sign the certificate for \"", options.common_name, "\""));
  }
  return ToPem(key->get(), c);
}

}  // namespace trainyard
