#include "cli/up_command.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/cli_flags.h"
#include "cli/connect.h"
#include "cli/job_client.h"
#include "cli/local_cluster.h"
#include "cli/submit_spec.h"
#include "cli/watch_job.h"
#include "core/device.h"
#include "core/file_util.h"
#include "core/status_macros.h"
#include "engine/task_loader.h"
#include "proto/job_spec.pb.h"
#include "proto/trainyard.pb.h"

namespace trainyard {
namespace {

// Set by SIGINT/SIGTERM.
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

// Bazel lays binaries out as bazel-bin/cli/trainyard,
// bazel-bin/controller/trainyard-controller and bazel-bin/worker/
// trainyard-worker.
std::string BazelBinDir() { return Dirname(ExecutableDir()); }

// The cluster's binaries, workers, device, threads and data directory (a
// new folder under /tmp unless --data_dir). Returns 0, or prints why not
// and returns the exit status.
int ClusterOptionsFromFlags(const CliFlags& flags, LocalClusterOptions* opts) {
  const std::string bazel_bin = BazelBinDir();
  opts->controller_bin = flags.controller_bin;
  if (opts->controller_bin.empty()) {
    opts->controller_bin = bazel_bin + "/controller/trainyard-controller";
  }
  opts->worker_bin = flags.worker_bin;
  if (opts->worker_bin.empty())
    opts->worker_bin = bazel_bin + "/worker/trainyard-worker";
  opts->plugin_dir = flags.plugin_dir;
  if (opts->plugin_dir.empty()) opts->plugin_dir = DefaultPluginDir();
  opts->workers = flags.workers;
  if (opts->workers < 1) {
    std::cerr << "trainyard up: --workers must be >= 1\n";
    return 2;
  }
  if (!flags.device.empty()) {
    absl::StatusOr<Device> d = ParseDevice(flags.device);
    if (!d.ok()) {
      std::cerr << "trainyard up: --device: " << d.status().message() << "\n";
      return 2;
    }
    opts->device = d->ToString();
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  opts->threads_per_worker =
      std::max<int>(1, static_cast<int>(cores) / opts->workers);
  opts->data_dir = flags.data_dir;
  if (opts->data_dir.empty()) {
    char tmpl[] = "/tmp/trainyard-up-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::cerr << "trainyard up: cannot create a data directory in /tmp\n";
      return 1;
    }
    opts->data_dir = tmpl;
  }
  return 0;
}

// The folder jobs' files must stay inside: --job_data_dir, else the --run
// spec's own folder, else the folder `trainyard` was started from (under
// `bazel run`, $BUILD_WORKING_DIRECTORY), made absolute with symlinks
// resolved. Returns 0, or prints why not and returns the exit status.
int ChooseJobDataDir(const CliFlags& flags, LocalClusterOptions* opts) {
  std::string dir = flags.job_data_dir;
  if (dir.empty() && !flags.run.empty()) {
    absl::StatusOr<std::string> spec =
        ResolveSymlinks(CleanAbsolutePath(flags.run));
    if (spec.ok()) dir = Dirname(*spec);
  }
  if (dir.empty()) {
    const char* started_in = std::getenv("BUILD_WORKING_DIRECTORY");
    dir = started_in != nullptr ? started_in : ".";
  }
  absl::StatusOr<std::string> real = ResolveSymlinks(CleanAbsolutePath(dir));
  struct stat st;
  if (!real.ok() || stat(real->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::cerr << "trainyard up: --job_data_dir: " << dir
              << " is not a folder\n";
    return 2;
  }
  opts->job_data_dir = *real;
  return 0;
}

// --device sets the job's device kind; without it, a cuda or sim job gets
// workers of its kind.
void MatchDeviceToJob(const CliFlags& flags, LocalClusterOptions* opts,
                      trainyard::v1::JobSpec* spec) {
  if (!flags.device.empty()) {
    spec->set_device(ParseDevice(opts->device)->KindName());
  } else if (spec->device() == "cuda") {
    opts->device = "cuda:0";
  } else if (spec->device() == "sim") {
    opts->device = "sim:0";
  }
}

// Waits until `count` workers have registered (bounded). Gives up at once
// when a child process died (`cluster`'s reason) or a signal arrived.
absl::Status WaitForWorkers(JobClient& client, int count,
                            absl::Duration timeout, LocalCluster* cluster) {
  const absl::Time deadline = absl::Now() + timeout;
  int seen = 0;
  while (absl::Now() < deadline) {
    if (g_stop.load()) return absl::CancelledError("interrupted");
    RETURN_IF_ERROR(cluster->CheckChildren());
    auto resp = client.ListWorkers();
    if (resp.ok()) {
      seen = resp->workers_size();
      if (seen >= count) return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("only ", seen, " of ", count, " workers registered within ",
                   absl::FormatDuration(timeout)));
}

// A client of the started cluster, as its admin; null after printing why.
std::unique_ptr<JobClient> ConnectToCluster(const LocalCluster& cluster,
                                            bool insecure) {
  JobClientSecurity security;
  security.tls.insecure = insecure;
  security.tls.ca_file = cluster.credentials().ca_cert;
  security.token = cluster.credentials().admin_token_value;
  absl::StatusOr<std::unique_ptr<JobClient>> connected =
      JobClient::Create(cluster.controller_address(), security);
  if (!connected.ok()) {
    std::cerr << "trainyard up: " << connected.status().message() << "\n";
    return nullptr;
  }
  return *std::move(connected);
}

// Where the cluster is, and how another shell reaches it.
void PrintClusterInfo(const LocalCluster& cluster,
                      const LocalClusterOptions& opts) {
  std::cerr << "trainyard up: controller at " << cluster.controller_address()
            << ", " << opts.workers << " workers registered; data and logs in "
            << opts.data_dir << "\n"
            << "trainyard up: jobs' files (data, weights, checkpoints, "
               "outputs) must stay inside "
            << opts.job_data_dir << " (--job_data_dir)\n";
  if (opts.insecure) {
    std::cerr << "trainyard up: --insecure: plaintext, no tokens; anyone on "
                 "this machine can use the cluster\n";
    return;
  }
  std::cerr << "trainyard up: TLS, worker certificates and tokens are on "
               "(throw-away CA in "
            << opts.data_dir
            << "/pki); to use this cluster from another shell:\n"
            << "  export TRAINYARD_CONTROLLER=" << cluster.controller_address()
            << "\n"
            << "  export TRAINYARD_CA=" << cluster.credentials().ca_cert << "\n"
            << "  export TRAINYARD_TOKEN_FILE="
            << cluster.credentials().admin_token << "\n"
            << "  (more users: trainyard token --user NAME --tokens_file "
            << cluster.credentials().tokens << ")\n";
}

// Runs the cluster until a signal (0) or a child's exit (1).
int ServeUntilStopped(LocalCluster& cluster) {
  std::cerr << "trainyard up: Ctrl-C stops the cluster\n";
  while (!g_stop.load()) {
    if (absl::Status st = cluster.CheckChildren(); !st.ok()) {
      std::cerr << "trainyard up: " << st.message() << "; stopping\n";
      cluster.Stop();
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::cerr << "trainyard up: stopping\n";
  cluster.Stop();
  return 0;
}

// "final eval after step N: loss L[, accuracy A]" from the job's last eval.
void PrintFinalEval(const WatchPrinter& p) {
  if (!p.has_eval()) return;
  const auto& ev = p.last_eval();
  auto it = ev.metrics().find("accuracy");
  std::cout << "final eval after step " << ev.step() << ": loss "
            << absl::StrFormat("%.4f", ev.loss());
  if (it != ev.metrics().end()) {
    std::cout << ", accuracy " << absl::StrFormat("%.4f", it->second);
  }
  std::cout << std::endl;
}

// --run: submits the job, watches it to its end (a signal cancels it) and
// stops the cluster. Returns WatchToEnd's status, 1 when interrupted.
int RunJob(JobClient& client, LocalCluster& cluster,
           const trainyard::v1::JobSpec& spec, absl::Duration reconnect) {
  auto job = client.Submit(spec, NewRequestId(), 0);
  if (!job.ok()) {
    int rc = ReportRpcError("up", client, job.status());
    cluster.Stop();
    return rc;
  }
  std::cerr << "trainyard up: submitted " << job->job_id() << " ("
            << spec.name() << ", " << spec.parallelism().stages()
            << " stages)\n";
  int rc =
      WatchToEnd(client, job->job_id(), 0, reconnect, PrintFinalEval, &g_stop);
  if (g_stop.load()) {
    std::cerr << "trainyard up: interrupted; cancelling " << job->job_id()
              << " and stopping the cluster\n";
    (void)client.Cancel(job->job_id(), "trainyard up interrupted");
    cluster.Stop();
    return 1;
  }
  cluster.Stop();
  return rc;
}

}  // namespace

int UpCommand(const CliFlags& flags) {
  LocalClusterOptions opts;
  if (int rc = ClusterOptionsFromFlags(flags, &opts); rc != 0) return rc;
  if (int rc = ChooseJobDataDir(flags, &opts); rc != 0) return rc;
  // Parse the job first: a bad spec should not cost a cluster start.
  std::optional<trainyard::v1::JobSpec> run_spec;
  if (!flags.run.empty()) {
    absl::StatusOr<trainyard::v1::JobSpec> spec = ReadSpecForSubmit(flags.run);
    if (!spec.ok()) {
      std::cerr << "trainyard up: --run: " << spec.status().message() << "\n";
      return 2;
    }
    run_spec = *std::move(spec);
    MatchDeviceToJob(flags, &opts, &*run_spec);
  }
  opts.insecure = flags.insecure;
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  LocalCluster cluster(opts);
  if (absl::Status st = cluster.Start(); !st.ok()) {
    std::cerr << "trainyard up: " << st.message() << "\n";
    return 1;
  }
  std::unique_ptr<JobClient> client = ConnectToCluster(cluster, opts.insecure);
  if (client == nullptr) return 1;
  if (absl::Status st =
          WaitForWorkers(*client, opts.workers, opts.start_timeout, &cluster);
      !st.ok()) {
    std::cerr << "trainyard up: " << st.message() << "; see the logs in "
              << opts.data_dir << "/logs\n";
    cluster.Stop();
    return 1;
  }
  PrintClusterInfo(cluster, opts);
  if (!run_spec.has_value()) return ServeUntilStopped(cluster);
  return RunJob(*client, cluster, *run_spec, ReconnectWindow(flags));
}

}  // namespace trainyard
