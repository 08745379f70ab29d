#include "cli/admin_commands.h"

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "cli/cli_flags.h"
#include "cli/connect.h"
#include "cli/job_client.h"
#include "grpcpp/grpcpp.h"
#include "proto/health.grpc.pb.h"
#include "security/cluster_credentials.h"
#include "security/tls.h"
#include "security/tokens.h"

namespace trainyard {

int CertsCommand(const CliFlags& flags) {
  const std::string out = flags.out;
  if (out.empty()) {
    std::cerr << "usage: trainyard certs --out DIR [--hosts NAME,...]\n";
    return 2;
  }
  std::vector<std::string> hosts =
      absl::StrSplit(flags.hosts, ',', absl::SkipWhitespace());
  absl::StatusOr<ClusterCredentials> creds =
      WriteClusterCredentials(out, hosts, /*overwrite=*/false);
  if (!creds.ok()) {
    std::cerr << "trainyard certs: " << creds.status().message() << "\n";
    return 1;
  }
  std::cout << "controller: --tls_cert=" << creds->controller_cert
            << " --tls_key=" << creds->controller_key
            << " --tls_ca=" << creds->ca_cert
            << " --tokens_file=" << creds->tokens << "\n"
            << "workers:    --tls_cert=" << creds->worker_cert
            << " --tls_key=" << creds->worker_key
            << " --tls_ca=" << creds->ca_cert << "\n"
            << "clients:    export TRAINYARD_CA=" << creds->ca_cert
            << " TRAINYARD_TOKEN_FILE=" << creds->admin_token << "\n"
            << "keep " << creds->ca_key
            << " offline: whoever holds it can mint worker certificates\n";
  return 0;
}

int TokenCommand(const CliFlags& flags) {
  const std::string user = flags.user;
  const std::string role_name = flags.role;
  if (user.empty()) {
    std::cerr << "usage: trainyard token --user NAME [--role user|admin] "
                 "[--tokens_file FILE]\n";
    return 2;
  }
  if (role_name != "user" && role_name != "admin") {
    std::cerr << "trainyard token: --role must be \"user\" or \"admin\", "
                 "got \""
              << role_name << "\"\n";
    return 2;
  }
  const Role role = role_name == "admin" ? Role::kAdmin : Role::kUser;
  const std::string token = NewToken();
  absl::StatusOr<std::string> line = TokensFileLine(user, role, token);
  if (!line.ok()) {
    std::cerr << "trainyard token: " << line.status().message() << "\n";
    return 2;
  }
  const std::string tokens_file = flags.tokens_file;
  if (!tokens_file.empty()) {
    absl::Status st = AppendToken(tokens_file, user, role, token);
    if (!st.ok()) {
      std::cerr << "trainyard token: " << st.message() << "\n";
      return 1;
    }
    std::cerr << "trainyard token: added " << role_name << " \"" << user
              << "\" to " << tokens_file
              << "; give them the token below (it is not stored)\n";
  } else {
    std::cerr << "trainyard token: add this line to the controller's "
                 "--tokens_file, and give the token below to "
              << user << ":\n"
              << *line;
  }
  std::cout << token << "\n";
  return 0;
}

int HealthCommand(const CliFlags& flags) {
  const std::string address = flags.address;
  if (address.empty()) {
    std::cerr << "usage: trainyard health --address HOST:PORT [--service S] "
                 "[--tls_ca FILE | --insecure]\n";
    return 2;
  }
  absl::StatusOr<JobClientSecurity> security = SecurityFromFlags(flags);
  if (!security.ok()) {
    std::cerr << "trainyard health: " << security.status().message() << "\n";
    return 2;
  }
  grpc::ChannelArguments args;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      MakeChannelCredentials(security->tls, &args);
  if (!creds.ok()) {
    std::cerr << "trainyard health: " << creds.status().message() << "\n";
    return 2;
  }
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateCustomChannel(address, *creds, args));
  grpc::ClientContext ctx;
  // Under Kubernetes' default probe timeout (5 s).
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(4));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(flags.service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status st = stub->Check(&ctx, req, &resp);
  if (!st.ok()) {
    std::cerr << "trainyard health: " << address << ": "
              << absl::StatusCodeToString(
                     static_cast<absl::StatusCode>(st.error_code()))
              << ": " << st.error_message() << "\n";
    return 1;
  }
  const std::string name =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
  std::cout << name << "\n";
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0
                                                                         : 1;
}

}  // namespace trainyard
