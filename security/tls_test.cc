#include "security/tls.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "proto/trainyard.grpc.pb.h"
#include "security/cluster_credentials.h"
#include "security/pki.h"

namespace trainyard {
namespace {

// GetJob answers with whether the caller presented a verified certificate,
// and its common name.
class EchoPeer final : public v1::JobService::CallbackService {
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest*,
                                   v1::Job* response) override {
    response->set_job_id(PeerHasVerifiedCertificate(*context) ? "verified"
                                                              : "anonymous");
    response->set_reason(PeerCommonName(*context));
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = JoinPath(::testing::TempDir(), "tls_test_pki");
    auto creds = WriteClusterCredentials(dir_, {"trainyard-controller"}, true);
    ASSERT_TRUE(creds.ok()) << creds.status();
    creds_ = *creds;
  }

  // Starts a server with `options` on a free port.
  void Serve(const TlsOptions& options) {
    auto server_creds = MakeServerCredentials(options);
    ASSERT_TRUE(server_creds.ok()) << server_creds.status();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *server_creds, &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  // GetJob through a channel made from `options`.
  grpc::Status Call(const TlsOptions& options, v1::Job* out) {
    grpc::ChannelArguments args;
    auto creds = MakeChannelCredentials(options, &args);
    EXPECT_TRUE(creds.ok()) << creds.status();
    auto channel = grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port_), *creds, args);
    auto stub = v1::JobService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    return stub->GetJob(&ctx, v1::GetJobRequest(), out);
  }

  TlsOptions ServerOptions() {
    TlsOptions o;
    o.cert_file = creds_.controller_cert;
    o.key_file = creds_.controller_key;
    o.ca_file = creds_.ca_cert;
    return o;
  }

  std::string dir_;
  ClusterCredentials creds_;
  EchoPeer service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(TlsTest, WorkerCertificateIsVerifiedAndUserChannelIsAnonymous) {
  Serve(ServerOptions());
  TlsOptions worker;
  worker.ca_file = creds_.ca_cert;
  worker.cert_file = creds_.worker_cert;
  worker.key_file = creds_.worker_key;
  v1::Job job;
  grpc::Status st = Call(worker, &job);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(job.job_id(), "verified");
  EXPECT_EQ(job.reason(), "trainyard-worker");

  TlsOptions user;
  user.ca_file = creds_.ca_cert;
  st = Call(user, &job);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(job.job_id(), "anonymous");
}

TEST_F(TlsTest, RefusedWithoutTheRightCaOrOverPlaintext) {
  Serve(ServerOptions());
  v1::Job job;
  // A client that does not trust the cluster CA (system roots only).
  TlsOptions system_roots;
  grpc::Status st = Call(system_roots, &job);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  // A plaintext client against the TLS port.
  TlsOptions plain;
  plain.insecure = true;
  st = Call(plain, &job);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  // A worker whose certificate another CA signed fails the handshake.
  const std::string other_dir = JoinPath(::testing::TempDir(), "tls_other");
  auto other = WriteClusterCredentials(other_dir, {}, true);
  ASSERT_TRUE(other.ok());
  TlsOptions stranger;
  stranger.ca_file = creds_.ca_cert;
  stranger.cert_file = other->worker_cert;
  stranger.key_file = other->worker_key;
  st = Call(stranger, &job);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  // The server name override: the certificate names trainyard-controller.
  TlsOptions named;
  named.ca_file = creds_.ca_cert;
  named.server_name = "trainyard-controller";
  st = Call(named, &job);
  EXPECT_TRUE(st.ok()) << st.error_message();
  named.server_name = "someone-else";
  st = Call(named, &job);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, BadFilesNameTheFlagAndFile) {
  TlsOptions o = ServerOptions();
  o.key_file = creds_.worker_key;  // another certificate's key
  auto r = MakeServerCredentials(o);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(r.status().message(),
                        "--tls_key " + creds_.worker_key + ": does not match"))
      << r.status();
  o = ServerOptions();
  o.cert_file = creds_.tokens;  // not PEM
  r = MakeServerCredentials(o);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "no PEM certificate"))
      << r.status();
  o = ServerOptions();
  o.ca_file = "/no/such/ca.pem";
  r = MakeServerCredentials(o);
  EXPECT_TRUE(
      absl::StrContains(r.status().message(), "--tls_ca /no/such/ca.pem"))
      << r.status();
  EXPECT_EQ(MakeServerCredentials(TlsOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = TlsOptions();
  o.cert_file = creds_.worker_cert;  // a key is needed too
  grpc::ChannelArguments args;
  EXPECT_EQ(MakeChannelCredentials(o, &args).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TlsTest, ExistingCaIsNotReplaced) {
  auto again = WriteClusterCredentials(dir_, {}, false);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  auto ca = ReadFileToString(creds_.ca_cert);
  ASSERT_TRUE(ca.ok());
  EXPECT_TRUE(absl::StrContains(*ca, "BEGIN CERTIFICATE"));
}

TEST(CheckSecurityFlagsTest, SecureByDefaultInsecureAlone) {
  auto flags = [](std::string cert, std::string name) {
    return std::vector<SecurityFlag>{{"--tls_cert", cert, true},
                                     {"--tls_key", cert, true},
                                     {"--tls_server_name", name, false}};
  };
  EXPECT_TRUE(CheckSecurityFlags(false, flags("c", ""), "h").ok());
  EXPECT_TRUE(CheckSecurityFlags(true, flags("", ""), "h").ok());

  absl::Status missing = CheckSecurityFlags(false, flags("", "n"), "hint");
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.message(),
            "secure by default: give --tls_cert and --tls_key (hint), or "
            "--insecure for plaintext");

  absl::Status mixed = CheckSecurityFlags(true, flags("", "n"), "hint");
  EXPECT_EQ(mixed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mixed.message(),
            "--insecure cannot be combined with --tls_cert, --tls_key or "
            "--tls_server_name");
}

}  // namespace
}  // namespace trainyard
