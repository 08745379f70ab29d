// trainyard-worker: the worker daemon. Dials the controller, registers, and
// runs the pipeline stages it is assigned until SIGTERM or SIGINT.
//
// Exit status: 0 after a signal, 2 bad flags, 1 the worker could not start
// (e.g. an address that cannot be bound).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/file_util.h"
#include "core/stop_signals.h"
#include "engine/task_loader.h"
#include "glog/logging.h"
#include "security/daemon_flags.h"
#include "worker/worker_daemon.h"

ABSL_FLAG(std::string, controller, "",
          "Controller address host:port (required).");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port where other stages connect to this worker; port 0 picks "
          "a free port (reported to the controller). Use 0.0.0.0:PORT in "
          "pods.");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port other workers dial for peer traffic, when it differs "
          "from --listen (e.g. $(POD_IP):7100 behind --listen=0.0.0.0:7100).");
ABSL_FLAG(int, stage_timeout_s, 120,
          "Longest wait for a neighbour stage or the all-reduce before the "
          "stage fails.");
ABSL_FLAG(std::string, device, "cpu",
          "\"cpu\", \"cuda:N\" (needs a build with the GPU path) or "
          "\"sim:N\" (the simulated device, for testing).");
ABSL_FLAG(std::string, plugin_dir, "",
          "Folder holding lib<plugin>.so task plugins (default: the "
          "task_plugins folder next to this binary's folder).");
ABSL_FLAG(std::string, data_dir, "",
          "Relative paths in assigned job specs resolve here (default: the "
          "current directory).");
ABSL_FLAG(int, threads, 0, "Compute (BLAS) threads; 0 = one per core.");
ABSL_FLAG(std::string, name, "",
          "Worker name reported to the controller (default: hostname-pid).");
ABSL_FLAG(uint64_t, memory_bytes, 0,
          "Memory jobs may use on this worker; 0 = physical memory.");
ABSL_FLAG(std::string, health_listen, "127.0.0.1:0",
          "host:port of the grpc.health.v1 + reflection server; empty = "
          "none.");
ABSL_FLAG(std::string, port_file, "",
          "Write the health server's port here once it listens.");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port for Prometheus GET /metrics (port 0 picks one); empty "
          "= none.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "Write the /metrics port here once it listens.");
ABSL_FLAG(std::string, tls_server_name, "",
          "The name to check in the controller's certificate instead of the "
          "host in --controller (e.g. its Service name).");
ABSL_FLAG(int, shutdown_grace_s, 20,
          "On SIGTERM / SIGINT, how long a running stage may take to finish "
          "its current step before the worker stops it (keep it below the "
          "pod's terminationGracePeriodSeconds).");

namespace {

// The worker's options from the flags, checked. Errors name the flag (exit
// status 2).
absl::StatusOr<trainyard::WorkerOptions> OptionsFromFlags() {
  trainyard::WorkerOptions options;
  options.controller = absl::GetFlag(FLAGS_controller);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  options.stage_timeout =
      absl::Seconds(std::max(1, absl::GetFlag(FLAGS_stage_timeout_s)));
  options.device = absl::GetFlag(FLAGS_device);
  options.plugin_dir = absl::GetFlag(FLAGS_plugin_dir);
  if (options.plugin_dir.empty()) {
    options.plugin_dir = trainyard::DefaultPluginDir();
  }
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.threads = absl::GetFlag(FLAGS_threads);
  if (options.threads == 0) {
    options.threads = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  }
  options.name = absl::GetFlag(FLAGS_name);
  options.memory_bytes = absl::GetFlag(FLAGS_memory_bytes);
  options.health_listen = absl::GetFlag(FLAGS_health_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.shutdown_grace =
      absl::Seconds(std::max(0, absl::GetFlag(FLAGS_shutdown_grace_s)));
  const std::string server_name = absl::GetFlag(FLAGS_tls_server_name);
  absl::StatusOr<trainyard::TlsOptions> tls =
      trainyard::DaemonTlsOptionsFromFlags(
          {{"--tls_server_name", server_name, false}},
          "worker.pem, worker.key and ca.pem from `trainyard certs`");
  if (!tls.ok()) return tls.status();
  options.tls = *tls;
  options.tls.server_name = server_name;
  if (options.tls.insecure) {
    LOG(WARNING) << "--insecure: plaintext to the controller and on the "
                    "health port";
  }
  return trainyard::ValidateWorkerOptions(options);
}

// Notifies `stop` at the first SIGTERM or SIGINT (`signals`, blocked in
// every thread), from a thread that lives until the process exits.
void StartSignalWaiter(sigset_t signals, absl::Notification* stop) {
  std::thread waiter([signals, stop] {
    const int sig = trainyard::WaitForStopSignal(signals);
    LOG(INFO) << "trainyard-worker: signal " << sig << ": shutting down";
    stop->Notify();
  });
  waiter.detach();
}

// Writes the ports of `worker`'s servers to --metrics_port_file and
// --port_file (those set), stopping at the first that fails.
absl::Status WritePortFiles(const trainyard::Worker& worker) {
  const std::string metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  if (!metrics_port_file.empty()) {
    absl::Status status = trainyard::WriteFileAtomically(
        metrics_port_file, absl::StrCat(worker.metrics_port(), "\n"));
    if (!status.ok()) return status;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    return trainyard::WriteFileAtomically(
        port_file, absl::StrCat(worker.health_port(), "\n"));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "trainyard-worker --controller=HOST:PORT [--listen=HOST:PORT] "
      "[--plugin_dir=DIR] [--data_dir=DIR] [--threads=N]");
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  // Before any thread starts, so only the waiter below sees them.
  const sigset_t signals = trainyard::BlockStopSignals();

  absl::StatusOr<trainyard::WorkerOptions> valid = OptionsFromFlags();
  if (!valid.ok()) {
    fprintf(stderr, "trainyard-worker: %s\n",
            std::string(valid.status().message()).c_str());
    return 2;
  }

  absl::Notification stop;
  StartSignalWaiter(signals, &stop);

  absl::Status port_status;
  absl::Status st =
      trainyard::RunWorker(*valid, &stop, [&](const trainyard::Worker& worker) {
        port_status = WritePortFiles(worker);
        // Through the signal waiter, so `stop` is notified exactly once.
        if (!port_status.ok()) kill(getpid(), SIGTERM);
      });
  if (st.ok()) st = port_status;
  if (!st.ok()) {
    fprintf(stderr, "trainyard-worker: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
