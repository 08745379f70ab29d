// WorkerOptions: what a worker daemon (worker/worker_daemon.h) is started
// with, the seams tests inject (transport factories), and the one check of
// what a user can get wrong.
#ifndef TRAINYARD_WORKER_WORKER_OPTIONS_H_
#define TRAINYARD_WORKER_WORKER_OPTIONS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "security/tls.h"
#include "transport/nccl_transport.h"
#include "transport/transport.h"

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

// Checks the options a user can get wrong (controller, device, plugin_dir)
// and fills in defaults (name, memory). InvalidArgument names the flag.
absl::StatusOr<WorkerOptions> ValidateWorkerOptions(WorkerOptions options);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_WORKER_OPTIONS_H_
