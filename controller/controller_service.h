// The controller's gRPC edge: JobService and WorkerService over a
// JobManager, and ControllerServer, which runs them (plus grpc.health.v1 and
// server reflection) on one listening port.
//
// Embedding in a test:
//   ControllerOptions opts;
//   opts.data_dir = dir;              // listen defaults to 127.0.0.1:0
//   ASSIGN_OR_RETURN(auto server, ControllerServer::Start(opts));
//   auto channel = grpc::CreateChannel(server->address(), ...);
//   ...
//   server->Shutdown();               // or just destroy it
//
// Ownership: ControllerServer owns the grpc::Server and the JobManager.
// Thread safety: every method of ControllerServer is thread-safe.
#ifndef TRAINYARD_CONTROLLER_CONTROLLER_SERVICE_H_
#define TRAINYARD_CONTROLLER_CONTROLLER_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/job_manager.h"
#include "controller/request_parsing.h"
#include "grpcpp/grpcpp.h"
#include "observability/prometheus_endpoint.h"
#include "prometheus/histogram.h"
#include "proto/trainyard.grpc.pb.h"
#include "security/tls.h"
#include "security/tokens.h"

namespace trainyard {

// The one absl -> gRPC status mapping used at the RPC edge (codes share
// their numeric values).
grpc::Status ToGrpcStatus(const absl::Status& status);

// Every call is authenticated first when `tokens` is set (a bearer token in
// the `authorization` request header; UNAUTHENTICATED otherwise), and runs
// as that caller (JobManager decides what they may see and do). Without
// `tokens` every caller is an anonymous admin (--insecure).
class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  // `submit_seconds` (may be null) observes each SubmitJob's latency.
  // `tokens` (may be null; not owned).
  //
  // A request whose bytes do not parse (malformed, or nested deeper than
  // protobuf's recursion limit) is answered INVALID_ARGUMENT saying why
  // (controller/request_parsing.h), after authentication.
  explicit JobServiceImpl(JobManager* manager,
                          prometheus::Histogram* submit_seconds = nullptr,
                          TokenTable* tokens = nullptr);
  // Open WatchJob streams.
  int64_t watchers() const { return watchers_->load(); }

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(
      grpc::CallbackServerContext* context,
      const v1::ListWorkersRequest* request,
      v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext* context,
      const v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* GetTrace(grpc::CallbackServerContext* context,
                                     const v1::GetTraceRequest* request,
                                     v1::GetTraceResponse* response) override;
  // The log lines held from request.from_seq on, then (with follow) new
  // ones until the job ends; one write in flight, so a slow reader holds
  // back only itself (lines that fall out of the ring meanwhile show as a
  // gap in seq).
  grpc::ServerWriteReactor<v1::LogLine>* WatchLogs(
      grpc::CallbackServerContext* context,
      const v1::WatchLogsRequest* request) override;

 private:
  absl::StatusOr<Caller> Authenticate(grpc::CallbackServerContext* context);

  JobManager* const manager_;                    // not owned
  prometheus::Histogram* const submit_seconds_;  // not owned; may be null
  TokenTable* const tokens_;                     // not owned; may be null
  // Shared with the watch reactors, which may outlive a call.
  std::shared_ptr<std::atomic<int64_t>> watchers_ =
      std::make_shared<std::atomic<int64_t>>(0);
};

// With `require_certificate`, a stream whose peer did not present a client
// certificate signed by the cluster CA is refused (UNAUTHENTICATED) before
// any message is read: it can neither register nor receive assignments.
//
// A message on the stream that does not parse ends it with INVALID_ARGUMENT
// ("WorkerService.Connect from <peer>: a message on its stream is not a
// valid trainyard.v1.WorkerMessage: <why>"); a registered worker is then
// lost with that reason.
class WorkerServiceImpl final : public v1::WorkerService::CallbackService {
 public:
  WorkerServiceImpl(JobManager* manager, bool require_certificate);

 private:
  // Connect, registered over parsed messages (controller/request_parsing.h).
  grpc::ServerBidiReactor<ParsedRequest<v1::WorkerMessage>,
                          v1::ControllerMessage>*
  ConnectParsed(grpc::CallbackServerContext* context);

  JobManager* const manager_;  // not owned
  const bool require_certificate_;
};

struct ControllerOptions {
  // host:port; port 0 picks a free one (see ControllerServer::port()).
  std::string listen = "127.0.0.1:0";
  std::string data_dir;  // required
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // JobManagerOptions::adopt_timeout and drain_timeout.
  absl::Duration adopt_timeout = absl::Seconds(10);
  absl::Duration drain_timeout = absl::Seconds(10);
  // Per job: the newest events held in memory (JobManagerOptions).
  int64_t events_in_memory = 4096;
  // Prometheus /metrics (docs/CONTROLLER.md, "Metrics"); empty = none.
  std::string metrics_listen;
  // The gRPC port's security. Plaintext by default here (in-process tests);
  // the daemon makes its operator choose (TLS files, or --insecure). With
  // tls.ca_file set, WorkerService needs a client certificate it signed.
  TlsOptions tls = [] {
    TlsOptions t;
    t.insecure = true;
    return t;
  }();
  // Users and their token hashes (security/tokens.h); empty = no
  // authentication (every caller is an anonymous admin).
  std::string tokens_file;
  // JobManagerOptions::job_data_dir and plugin_dir.
  std::string job_data_dir;
  std::string plugin_dir;
};

class ControllerServer {
 public:
  // Opens the store, starts the manager and the gRPC server. Errors: those
  // of JobManager::Create, or Unavailable naming the address that could not
  // be bound.
  static absl::StatusOr<std::unique_ptr<ControllerServer>> Start(
      const ControllerOptions& options);
  ~ControllerServer();

  int port() const { return port_; }
  // Port of /metrics; 0 when there is none.
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  // "127.0.0.1:<port>" style address clients can dial.
  std::string address() const { return address_; }
  JobManager* manager() { return manager_.get(); }

  // Closes worker streams, ends open calls (watchers are cancelled) and
  // stops the server. Idempotent; the destructor calls it.
  void Shutdown();
  // Blocks until Shutdown has been called (from another thread).
  void Wait();

 private:
  ControllerServer() = default;
  // Everything after the manager: authentication, /metrics, the services
  // and the listening port. On error the caller shuts the manager down.
  absl::Status Serve(const ControllerOptions& options);
  // Builds and starts the gRPC server on options.listen; sets port_ and
  // address_.
  absl::Status Listen(
      const ControllerOptions& options,
      const std::shared_ptr<grpc::ServerCredentials>& credentials);

  std::unique_ptr<JobManager> manager_;
  std::unique_ptr<TokenTable> tokens_;
  std::unique_ptr<MetricsEndpoint> metrics_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_CONTROLLER_SERVICE_H_
