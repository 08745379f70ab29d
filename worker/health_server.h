// HealthServer: a worker's grpc.health.v1 service (with server reflection)
// for its pod's probes. The overall "" status is SERVING while the process
// runs (liveness); kRegisteredService is SERVING exactly while the worker
// is registered with its controller (readiness).
//
// Thread safety: every method may be called from any thread.
#ifndef TRAINYARD_WORKER_HEALTH_SERVER_H_
#define TRAINYARD_WORKER_HEALTH_SERVER_H_

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "security/tls.h"

namespace trainyard {

class HealthServer {
 public:
  // The readiness service's name.
  static constexpr char kRegisteredService[] =
      "trainyard.v1.WorkerRegistration";

  // Serves on `listen` with `tls`'s certificate (probes need no client
  // certificate: its ca_file is not used). Errors: bad TLS files;
  // Unavailable naming --health_listen when it cannot listen.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(
      const std::string& listen, const TlsOptions& tls);
  ~HealthServer();  // Shutdown()
  HealthServer(const HealthServer&) = delete;
  HealthServer& operator=(const HealthServer&) = delete;

  int port() const { return port_; }
  // Readiness: kRegisteredService's status.
  void SetRegistered(bool registered);
  // Stops serving. Idempotent.
  void Shutdown();

 private:
  HealthServer(std::unique_ptr<grpc::Server> server, int port)
      : server_(std::move(server)), port_(port) {}

  std::unique_ptr<grpc::Server> server_;
  const int port_;
  std::once_flag shutdown_once_;
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_HEALTH_SERVER_H_
