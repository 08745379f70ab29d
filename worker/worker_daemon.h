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
// placements in its assignment, reports the choice, and connects (TCP over
// the worker's PeerListener) or creates it (NCCL, its unique ids exchanged
// through the controller): worker/stage_transport.h. A cancel or failure
// aborts whichever is in use: the rendezvous while the transport is being
// created, then the transport itself (ncclCommAbort for NCCL).
//
// The parts, each in its own file: worker/worker_options.h (what a worker
// is started with), worker/controller_stream.h (connect, register,
// heartbeat, reconnect), worker/report_outbox.h (reports kept and resent),
// worker/assignment_runner.h (one assignment, from its spec to its end),
// worker/stage_transport.h, worker/active_job.h (how a running stage is
// stopped), worker/snapshot_cache.h, worker/report_messages.h (engine
// reports as wire messages), worker/worker_metrics.h and
// worker/health_server.h. The daemon itself (worker_daemon.cc) holds its
// lifetime and its one job slot.
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

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "worker/worker_options.h"

namespace trainyard {

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
