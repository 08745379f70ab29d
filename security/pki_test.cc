#include "security/pki.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

X509* ParseCert(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  return cert;
}

// Verifies `leaf` against `ca` with OpenSSL's own chain verification for
// `purpose` (X509_PURPOSE_SSL_SERVER / _CLIENT); the error string if not.
std::string Verify(const std::string& ca_pem, const std::string& leaf_pem,
                   int purpose) {
  X509* ca = ParseCert(ca_pem);
  X509* leaf = ParseCert(leaf_pem);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, leaf, nullptr);
  X509_STORE_CTX_set_purpose(ctx, purpose);
  const int ok = X509_verify_cert(ctx);
  std::string err =
      ok == 1 ? ""
              : X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx));
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  X509_free(leaf);
  X509_free(ca);
  return err;
}

TEST(PkiTest, LeafVerifiesAgainstItsCaForItsPurposesOnly) {
  auto ca = NewCertificateAuthority("test CA", absl::Hours(1));
  ASSERT_TRUE(ca.ok()) << ca.status();
  CertificateOptions server;
  server.common_name = "controller";
  server.hosts = {"127.0.0.1", "trainyard-controller"};
  server.server_auth = true;
  auto leaf = IssueCertificate(*ca, server);
  ASSERT_TRUE(leaf.ok()) << leaf.status();
  EXPECT_EQ(Verify(ca->cert_pem, leaf->cert_pem, X509_PURPOSE_SSL_SERVER), "");
  EXPECT_NE(Verify(ca->cert_pem, leaf->cert_pem, X509_PURPOSE_SSL_CLIENT), "");

  // The subjectAltNames: an IP entry and a DNS entry.
  X509* cert = ParseCert(leaf->cert_pem);
  ASSERT_NE(cert, nullptr);
  EXPECT_EQ(X509_check_ip_asc(cert, "127.0.0.1", 0), 1);
  EXPECT_EQ(X509_check_host(cert, "trainyard-controller", 0, 0, nullptr), 1);
  EXPECT_NE(X509_check_host(cert, "evil.example", 0, 0, nullptr), 1);
  X509_free(cert);

  // Another CA's leaf does not verify against this CA.
  auto other = NewCertificateAuthority("other CA", absl::Hours(1));
  ASSERT_TRUE(other.ok());
  auto stranger = IssueCertificate(*other, server);
  ASSERT_TRUE(stranger.ok());
  EXPECT_NE(Verify(ca->cert_pem, stranger->cert_pem, X509_PURPOSE_SSL_SERVER),
            "");
}

TEST(PkiTest, BadCaIsInvalidArgument) {
  CertificateOptions opts;
  opts.common_name = "x";
  auto r = IssueCertificate({"not a key", "not a cert"}, opts);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("CA key"), std::string::npos);

  auto a = NewCertificateAuthority("a", absl::Hours(1));
  auto b = NewCertificateAuthority("b", absl::Hours(1));
  ASSERT_TRUE(a.ok() && b.ok());
  r = IssueCertificate({a->key_pem, b->cert_pem}, opts);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("does not match"), std::string::npos);

  opts.common_name = "";
  r = IssueCertificate(*a, opts);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard
