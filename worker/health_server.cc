#include "worker/health_server.h"

#include <chrono>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace trainyard {

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(
    const std::string& listen, const TlsOptions& tls) {
  static std::once_flag once;
  std::call_once(once, [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  });
  TlsOptions health_tls = tls;
  health_tls.ca_file.clear();  // probes need no client certificate
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                   MakeServerCredentials(health_tls));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, creds, &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("--health_listen ", listen, ": cannot listen"));
  }
  // "" (liveness): the process serves. kRegisteredService (readiness):
  // registered with the controller right now.
  server->GetHealthCheckService()->SetServingStatus(true);
  server->GetHealthCheckService()->SetServingStatus(kRegisteredService, false);
  return std::unique_ptr<HealthServer>(
      new HealthServer(std::move(server), port));
}

HealthServer::~HealthServer() { Shutdown(); }

void HealthServer::SetRegistered(bool registered) {
  server_->GetHealthCheckService()->SetServingStatus(kRegisteredService,
                                                     registered);
}

void HealthServer::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  });
}

}  // namespace trainyard
