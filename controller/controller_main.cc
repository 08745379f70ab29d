// trainyard-controller: the Trainyard control plane daemon. Serves
// JobService (users) and WorkerService (worker daemons) on --listen, keeps
// its state in an SQLite database under --data_dir, and stops cleanly on
// SIGTERM / SIGINT. docs/CONTROLLER.md describes states, scheduling and
// persistence.
#include <signal.h>
#include <stdio.h>

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "controller/controller_service.h"
#include "core/file_util.h"
#include "core/stop_signals.h"
#include "glog/logging.h"
#include "security/daemon_flags.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "host:port to serve on; port 0 picks a free port (see --port_file)");
ABSL_FLAG(std::string, data_dir, "",
          "Folder holding the controller's database (controller.db). "
          "Required.");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 1000,
          "How often workers are told to send a heartbeat.");
ABSL_FLAG(int64_t, heartbeat_timeout_ms, 5000,
          "A worker silent for this long is declared lost and its job "
          "restarts (JobSpec.recovery) or fails.");
ABSL_FLAG(int64_t, adopt_timeout_ms, 10000,
          "After a restart, how long a job that was RUNNING waits for its "
          "workers to reconnect and reclaim their stages before it is "
          "restarted from its newest checkpoint instead.");
ABSL_FLAG(int64_t, drain_timeout_ms, 10000,
          "How long a restarting job waits for a cancelled stage of its old "
          "gang to stop before that stage's worker is declared lost.");
ABSL_FLAG(int64_t, events_in_memory, 4096,
          "Per job, the newest events (steps, evals, state changes) held in "
          "memory for WatchJob; older ones are read from controller.db.");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port for Prometheus GET /metrics (port 0 picks one; see "
          "--metrics_port_file); empty = no metrics endpoint.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "If set, the /metrics port is written here (atomically) once "
          "serving.");
ABSL_FLAG(std::string, tokens_file, "",
          "Users, roles and token hashes (`trainyard token` adds one); "
          "re-read when it changes. Every JobService call needs a token.");
ABSL_FLAG(std::string, job_data_dir, "",
          "The workers' data folder (their --data_dir, e.g. /data in the "
          "pods) as specs name it: a spec with a path that leaves it is "
          "refused at submit (INVALID_ARGUMENT naming the field). Empty = "
          "only the workers check.");
ABSL_FLAG(std::string, plugin_dir, "",
          "The workers' task plugins (the same lib<name>.so files): when set, "
          "SubmitJob also checks task.config with the plugin's "
          "validate_config (no files opened). Only trusted plugins: their "
          "code runs in the controller. Empty = the workers check.");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written here (atomically) once the "
          "server is serving.");

namespace trainyard {
namespace {

// Serves until SIGTERM or SIGINT. The signals must already be blocked in
// every thread (main does it before any thread starts).
absl::Status RunServer(const ControllerOptions& options,
                       const std::string& port_file,
                       const sigset_t& stop_signals) {
  absl::StatusOr<std::unique_ptr<ControllerServer>> server =
      ControllerServer::Start(options);
  if (!server.ok()) return server.status();
  const std::string metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  if (!metrics_port_file.empty()) {
    // Written first: once --port_file exists, both are there.
    absl::Status st = WriteFileAtomically(
        metrics_port_file, absl::StrCat((*server)->metrics_port(), "\n"));
    if (!st.ok()) return st;
  }
  if ((*server)->metrics_port() > 0) {
    LOG(INFO) << "metrics on port " << (*server)->metrics_port();
  }
  if (!port_file.empty()) {
    absl::Status st =
        WriteFileAtomically(port_file, absl::StrCat((*server)->port(), "\n"));
    if (!st.ok()) return st;
  }
  const int sig = WaitForStopSignal(stop_signals);
  LOG(INFO) << "signal " << sig << ": shutting down";
  (*server)->Shutdown();
  return absl::OkStatus();
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "trainyard-controller --data_dir=DIR [--listen=HOST:PORT]");
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  // Before gRPC starts its threads, so only RunServer's wait sees them.
  const sigset_t signals = trainyard::BlockStopSignals();

  trainyard::ControllerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.heartbeat_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms));
  options.heartbeat_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
  options.adopt_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_adopt_timeout_ms));
  options.drain_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms));
  options.events_in_memory = absl::GetFlag(FLAGS_events_in_memory);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (options.data_dir.empty()) {
    fprintf(stderr, "trainyard-controller: --data_dir is required\n");
    return 2;
  }
  options.tokens_file = absl::GetFlag(FLAGS_tokens_file);
  options.job_data_dir = absl::GetFlag(FLAGS_job_data_dir);
  options.plugin_dir = absl::GetFlag(FLAGS_plugin_dir);
  absl::StatusOr<trainyard::TlsOptions> tls =
      trainyard::DaemonTlsOptionsFromFlags(
          {{"--tokens_file", options.tokens_file, true}},
          "`trainyard certs --out DIR` makes them all");
  if (!tls.ok()) {
    fprintf(stderr, "trainyard-controller: %s\n",
            std::string(tls.status().message()).c_str());
    return 2;
  }
  options.tls = *tls;
  if (options.tls.insecure) {
    LOG(WARNING) << "--insecure: plaintext gRPC and no authentication; "
                    "anyone who can reach "
                 << options.listen
                 << " can submit, see and cancel every job and register as "
                    "a worker";
  }
  absl::Status st =
      trainyard::RunServer(options, absl::GetFlag(FLAGS_port_file), signals);
  if (!st.ok()) {
    fprintf(stderr, "trainyard-controller: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
