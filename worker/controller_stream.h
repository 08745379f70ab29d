// ControllerStream: a worker's side of WorkerService.Connect. Dials the
// controller (TLS per WorkerOptions.tls, HTTP/2 keepalive), sends
// RegisterWorker (its capabilities, the id of its last registration and the
// stage it claims), waits for WorkerRegistered, heartbeats every
// heartbeat_interval_ms, and hands the controller's messages to its
// Delegate; when the stream breaks it reconnects with bounded exponential
// backoff, until it is stopped.
//
// Thread safety: one thread runs the connection loop and calls the
// Delegate; every public method may be called from any thread.
#ifndef TRAINYARD_WORKER_CONTROLLER_STREAM_H_
#define TRAINYARD_WORKER_CONTROLLER_STREAM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "proto/trainyard.grpc.pb.h"
#include "proto/trainyard.pb.h"
#include "worker/health_server.h"
#include "worker/worker_options.h"

namespace trainyard {

// One Connect stream and what the threads sharing it know about it.
struct Session {
  grpc::ClientContext context;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::WorkerMessage, v1::ControllerMessage>>
      stream;

  absl::Mutex write_mu;  // gRPC allows one writer at a time
  bool writes_closed ABSL_GUARDED_BY(write_mu) = false;

  absl::Mutex mu;
  absl::CondVar cv;
  bool registered ABSL_GUARDED_BY(mu) = false;
  bool done ABSL_GUARDED_BY(mu) = false;  // the reader saw the stream end
  int64_t heartbeat_interval_ms ABSL_GUARDED_BY(mu) = 1000;

  // False once the stream is broken (the reader notices it too) or its
  // writes are closed (nothing is written after the half-close).
  bool Write(const v1::WorkerMessage& message) {
    absl::MutexLock lock(&write_mu);
    return !writes_closed && stream->Write(message);
  }
  // Half-closes the stream: the controller reads what was written, then
  // its end. Later writes are refused, so none can break the stream while
  // the controller is still reading.
  void CloseWrites() {
    absl::MutexLock lock(&write_mu);
    if (writes_closed) return;
    writes_closed = true;
    stream->WritesDone();
  }
  bool closed_writes() {
    absl::MutexLock lock(&write_mu);
    return writes_closed;
  }
};

class ControllerStream {
 public:
  // What the worker does with the stream; called on the stream's thread.
  class Delegate {
   public:
    virtual ~Delegate() = default;
    // Fills RegisterWorker.running: the stage this worker runs (or ran,
    // with reports to resend), which a restarted controller re-adopts.
    virtual void ClaimStage(v1::RegisterWorker* registration) = 0;
    // The controller accepted the registration on `session`.
    virtual void OnRegistered(Session* session,
                              const v1::WorkerRegistered& registered) = 0;
    // The controller's messages after the registration.
    virtual void OnAssign(Session* session,
                          const v1::StageAssignment& assignment) = 0;
    virtual void OnCancel(const v1::CancelStage& cancel) = 0;
    virtual void OnRendezvousReply(const v1::RendezvousReply& reply) = 0;
    // `session`'s stream has ended (nothing more will be read from it).
    virtual void OnStreamEnded(Session* session) = 0;
  };

  // `options` (validated: ValidateWorkerOptions) name the controller, the
  // TLS files, the timeouts and what RegisterWorker reports; peers dial
  // `peer_address`; `health` (null: none) shows whether the worker is
  // registered. `options`, `health` and `delegate` must outlive the stream.
  ControllerStream(const WorkerOptions& options, std::string peer_address,
                   HealthServer* health, Delegate* delegate);
  ~ControllerStream();  // Stop()
  ControllerStream(const ControllerStream&) = delete;
  ControllerStream& operator=(const ControllerStream&) = delete;

  // Starts the connection loop.
  void Start();
  // No reconnecting once the current session ends (the worker drains).
  void StopReconnecting() { stop_reconnecting_.store(true); }
  // Cancels the current session and joins the loop. Idempotent.
  void Stop();

  // The id of the latest registration ("" before the first).
  std::string worker_id() const;
  // How many times the controller accepted this worker's registration.
  int64_t registrations() const;

 private:
  void ConnectionLoop();
  // One connect / register / serve cycle; true if the controller accepted
  // the registration.
  bool RunSession(int attempt);
  // Makes `session` the current one; false when stopping.
  bool BeginSession(Session* session);
  void EndSession();
  // A stub on a new channel to the controller.
  absl::StatusOr<std::unique_ptr<v1::WorkerService::Stub>> Dial();
  v1::WorkerMessage Hello();
  // Reads the stream until it ends; true if the registration was accepted.
  bool Serve(Session* session);
  void OnRegistered(Session* session, const v1::WorkerRegistered& registered);
  // Also the registration watchdog: it cancels the stream if the
  // controller does not answer in time, which ends Serve.
  void HeartbeatLoop(Session* session);
  // Waits until `session` is registered (true) or gives up on it.
  bool AwaitRegistration(Session* session);

  const WorkerOptions& options_;
  const std::string peer_address_;
  HealthServer* const health_;
  Delegate* const delegate_;

  absl::Notification shutdown_;
  std::atomic<bool> stop_reconnecting_{false};
  std::thread thread_;
  std::once_flag stop_once_;

  mutable absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  Session* session_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  int64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_CONTROLLER_STREAM_H_
