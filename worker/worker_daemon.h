// The worker daemon (`trainyard-worker`): dials the controller, keeps one
// WorkerService.Connect stream open, and runs the pipeline stages the
// controller assigns to it, one job at a time, reporting every step, eval
// and the stage's end back on the stream.
//
// Life of a worker: bind the peer listener (its address is reported in
// RegisterWorker so other stages can dial it) and the health server; then,
// until Shutdown: connect, send RegisterWorker, wait for WorkerRegistered,
// heartbeat every heartbeat_interval_ms, and serve StageAssignment /
// CancelStage. When the stream breaks or the controller is unreachable, a
// running stage keeps training: its reports (steps, evals, its end) are
// kept, and the worker retries with bounded exponential backoff, registers
// again under the same worker id, claims the stage it runs
// (RegisterWorker.running) and resends the kept reports. A restarted
// controller re-adopts the job from these claims; a controller that does
// not accept a claim answers with CancelStage.
//
// Multi-stage jobs: every rank chooses the same transport from the
// placements in its assignment (ChooseAssignmentTransport below, which
// applies transport/transport_select.h), logs the choice and its reason and
// reports it to the controller (StageTransport, kept in the job's history).
// TCP: the worker's PeerListener and core/tcp_transport. NCCL (every stage
// on its own GPU): core/nccl_transport, whose unique ids rank 0 puts and
// the others get through the controller (a RemoteRendezvous over this
// worker's stream, replies matched by request id). A cancel or failure
// aborts whichever is in use: the rendezvous while the transport is being
// created, then the transport itself (ncclCommAbort for NCCL).
//
// A worker survives bad input: an assignment that cannot run (a spec that
// fails PlanJob, an unknown plugin, a missing data file, peers that do not
// connect) ends as StageDone{ok=false, error=<what and why>} and the worker
// stays idle, ready for the next one.
//
// Ownership: a Worker owns its threads, its listener and its health server;
// destroying it shuts it down. Thread safety: every public method of Worker
// may be called from any thread.
#ifndef TRAINYARD_WORKER_WORKER_DAEMON_H_
#define TRAINYARD_WORKER_WORKER_DAEMON_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "transport/nccl_transport.h"
#include "transport/transport.h"
#include "transport/transport_select.h"
#include "proto/trainyard.pb.h"
#include "security/tls.h"

namespace trainyard {

// Opens the stage-to-stage transport of rank `rank` of a multi-stage job
// whose ranks listen at `peer_addresses` (indexed by rank). `cancel` (never
// null, owned by the worker, valid for the call) becomes true when the job
// is cancelled or fails; the factory should then give up promptly and
// return Cancelled rather than wait out its connect timeout.
// `secret` is the assignment's data-plane secret
// (StageAssignment.data_plane_secret).
using TransportFactory =
    std::function<absl::StatusOr<std::unique_ptr<Transport>>(
        const std::string& job_id, int rank,
        const std::vector<std::string>& peer_addresses,
        const std::string& secret, const std::atomic<bool>* cancel)>;

// Creates an NCCL transport (transport/nccl_transport.h's CreateNcclTransport
// by default). `options.rendezvous` is the worker's rendezvous through the
// controller, valid for the call.
using NcclTransportFactory =
    std::function<absl::StatusOr<std::unique_ptr<Transport>>(
        const NcclTransportOptions& options)>;

struct WorkerOptions {
  // host:port of the controller's WorkerService. Required.
  std::string controller;
  // Where peers (other stages) connect to this worker; port 0 picks one.
  std::string listen = "127.0.0.1:0";
  // "cpu" or "cuda:N": where this worker's stages run. A GPU that is not
  // usable (no driver, no such device, a build without CUDA) fails Start.
  std::string device = "cpu";
  // Folder holding lib<plugin>.so. Required.
  std::string plugin_dir;
  // Relative paths in assigned specs resolve here; empty = the current
  // directory. When set, every path in an assigned spec must resolve inside
  // it, symlinks included (PlanOptions::confine_to).
  std::string data_dir;
  // Compute (BLAS) threads, process-wide; 0 = leave as is.
  int threads = 0;
  // Stable worker name; empty = "<hostname>-<pid>".
  std::string name;
  // Memory jobs may use (reported, and the PlanJob limit); 0 = physical
  // memory.
  uint64_t memory_bytes = 0;
  // grpc.health.v1 + server reflection; empty = no health server.
  std::string health_listen = "127.0.0.1:0";
  // Prometheus GET /metrics (docs/CONTROLLER.md, "Metrics"); empty = none.
  std::string metrics_listen;
  // Security of the channel to the controller (ca_file verifies it;
  // cert_file/key_file are the client certificate the controller checks)
  // and of the health port (served with the same certificate). Plaintext
  // by default here (in-process tests); the daemon makes its operator
  // choose (TLS files, or --insecure).
  TlsOptions tls = [] {
    TlsOptions t;
    t.insecure = true;
    return t;
  }();

  // Longest wait for WorkerRegistered after RegisterWorker.
  absl::Duration register_timeout = absl::Seconds(10);
  // Reconnect backoff: doubles from min to max, reset by a registration.
  absl::Duration min_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // Longest wait for a neighbour stage or the all-reduce.
  absl::Duration stage_timeout = absl::Minutes(2);
  // Longest wait for all peers of a multi-stage job to connect. A cancel
  // cuts the wait short.
  absl::Duration peer_connect_timeout = absl::Seconds(30);
  // On a stop (RunWorker), how long a running stage may take to finish its
  // step (Worker::Drain). Below Kubernetes' default
  // terminationGracePeriodSeconds (30).
  absl::Duration shutdown_grace = absl::Seconds(20);

  // How multi-stage jobs whose transport choice is TCP reach their peers.
  // Null = the TCP transport over a PeerListener bound to `listen`
  // (transport/tcp_transport.h). Tests inject fakes here; `peer_address` must
  // then be set too.
  TransportFactory connect_transport;
  // The address reported to the controller when connect_transport is set.
  std::string peer_address;
  // The host:port peers should dial when it differs from the bound address
  // (e.g. --listen=0.0.0.0:7100 in a pod, advertised as $(POD_IP):7100).
  // Empty = the bound address.
  std::string advertise_address;
  // How jobs whose transport choice is NCCL create it. Null =
  // CreateNcclTransport. Tests inject fakes here.
  NcclTransportFactory create_nccl_transport;
  // Start fails when `device` is a GPU this process cannot use. Tests of
  // the GPU path's error handling turn this off on machines without a GPU
  // (the worker then registers, and its stages fail when they start).
  bool check_device = true;
};

// The transport the stages of a multi-stage assignment use, from its
// placements (the same on every rank, so every rank decides the same):
// transport/transport_select.h's ChooseTransport with `nccl_built`
// (NcclTransportBuilt() in the daemon). An assignment without placements
// (from a controller older than that field) uses TCP. Errors:
// InvalidArgument naming StageAssignment.placements when their number is
// not `num_stages` or one names a bad device or an empty host.
absl::StatusOr<TransportChoice> ChooseAssignmentTransport(
    const v1::StageAssignment& assignment, int num_stages, bool nccl_built);

// Checks the options a user can get wrong (controller, device, plugin_dir)
// and fills in defaults (name, memory). InvalidArgument names the flag.
absl::StatusOr<WorkerOptions> ValidateWorkerOptions(WorkerOptions options);

class Worker {
 public:
  // Validates `options`, binds the peer listener and the health server,
  // and starts the connection loop in the background. Errors (bad options,
  // an address that cannot be bound) name the option and the reason. The
  // controller need not be up yet.
  static absl::StatusOr<std::unique_ptr<Worker>> Start(WorkerOptions options);
  ~Worker();  // Shutdown()

  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Aborts a running stage, closes the stream and joins every thread.
  // Idempotent.
  void Shutdown();

  // A graceful stop's first half (SIGTERM, a pod being deleted): a running
  // stage finishes the step it is in and then ends, reporting to the
  // controller that this worker is shutting down (UNAVAILABLE, so the job
  // restarts from its newest checkpoint or snapshot on other workers). Waits
  // up to `grace` for the stage to end; Shutdown then stops whatever is
  // left. A stage waiting on a neighbour that does not finish its step
  // waits until `grace` runs out.
  void Drain(absl::Duration grace);

  // host:port peers dial (reported as capabilities.peer_address).
  std::string peer_address() const;
  // Port of the health/reflection server; 0 when there is none.
  int health_port() const;
  // Port of /metrics; 0 when there is none.
  int metrics_port() const;
  // The id of the latest registration ("" before the first).
  std::string worker_id() const;
  // How many times the controller accepted this worker's registration.
  int64_t registrations() const;
  // True while a stage runs.
  bool busy() const;

 private:
  class Impl;
  explicit Worker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Starts a worker and runs it until `stop` is notified (main's signal
// handler) or, with stop == nullptr, forever. `on_started` (may be null)
// is called once the worker is up, e.g. to write the health port file.
// When `stop` is notified it drains for options.shutdown_grace, then shuts
// down.
absl::Status RunWorker(const WorkerOptions& options, absl::Notification* stop,
                       const std::function<void(const Worker&)>& on_started);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_WORKER_DAEMON_H_
