// trainyard: the command-line client. See kUsage below and the README's CLI
// reference.
//
// Exit status: 0 success (for watch/submit --watch/up --run: the job
// SUCCEEDED), 1 a failure while running (or the job ended FAILED or
// CANCELLED), 2 bad usage or a bad spec, 3 the controller could not be
// reached or refused the call.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/chrome_trace.h"
#include "cli/job_client.h"
#include "cli/job_format.h"
#include "cli/local_cluster.h"
#include "cli/submit_spec.h"
#include "core/device.h"
#include "core/file_util.h"
#include "core/status_macros.h"
#include "engine/local_job.h"
#include "kernels/blas.h"
#include "plan/job_plan.h"
#include "proto/health.grpc.pb.h"
#include "schedule/schedule.h"
#include "schedule/schedule_timeline.h"
#include "security/cluster_credentials.h"
#include "security/tls.h"
#include "security/tokens.h"

ABSL_FLAG(std::string, spec, "", "Job spec file (proto3 JSON).");
ABSL_FLAG(std::string, metrics_out, "",
          "Write the JSON metric lines here instead of stdout.");
ABSL_FLAG(std::string, plugin_dir, "",
          "Folder holding lib<plugin>.so task plugins (default: the "
          "task_plugins folder next to this binary's folder).");
ABSL_FLAG(int, threads, 0, "BLAS threads (0 = one per core).");
ABSL_FLAG(std::string, device, "",
          "train: where every stage runs, \"cpu\", \"cuda:N\" or \"sim:N\" "
          "(the simulated device) (default: the spec's device; cuda means "
          "cuda:0). up: every worker's device (default cpu). Overrides the "
          "--spec / --run spec's device kind.");
ABSL_FLAG(std::string, precision, "",
          "train: fp32, tf32 or bf16 (default: the spec's precision).");
ABSL_FLAG(int, stages, 0,
          "train: pipeline stages (default: the spec's), blocks split "
          "evenly by parameter count. schedule: pipeline stages.");
ABSL_FLAG(int, microbatches, 0, "schedule: microbatches per step.");
ABSL_FLAG(std::string, schedule, "1f1b",
          "schedule: gpipe, 1f1b, zbh1, interleaved or zbv.");
ABSL_FLAG(int, chunks, 0,
          "schedule: model chunks per stage (default: 1; 2 for interleaved "
          "and zbv).");
ABSL_FLAG(std::string, costs, "1,1,1",
          "schedule: time of a whole stage's forward, input-gradient and "
          "weight-gradient pass of one microbatch, as F,B,W (e.g. measured "
          "with `get JOB --stages`; 1,2,0 is an unsplit backward).");
ABSL_FLAG(std::string, svg, "", "schedule: also draw the timeline here.");
ABSL_FLAG(std::string, costs_from, "",
          "schedule: take F,B,W from a job's newest traced step instead of "
          "--costs: the mean forward, input- and weight-gradient span per "
          "microbatch over the job's stages (GetTrace; the controller at "
          "--controller).");
ABSL_FLAG(int, width, 120, "schedule: columns of the text timeline.");
ABSL_FLAG(int64_t, stop_after_step, 0,
          "Stop after this many completed steps, as if interrupted "
          "(checkpoints permitting, a rerun with resume \"latest\" "
          "continues).");
ABSL_FLAG(int, timeout_s, 120,
          "train: longest wait for a neighbour stage or the all-reduce "
          "before the job fails (raise it for very large steps).");
ABSL_FLAG(std::string, controller, "",
          "Controller address host:port (default: $TRAINYARD_CONTROLLER, "
          "else 127.0.0.1:7070).");
ABSL_FLAG(int, priority, 0, "submit: higher runs first.");
ABSL_FLAG(std::string, request_id, "",
          "submit: idempotency key (default: a fresh random id; reuse one to "
          "retry a submit safely).");
ABSL_FLAG(bool, watch, false, "submit: watch the job until it ends.");
ABSL_FLAG(int64_t, from_step, 0, "watch: replay from this step.");
ABSL_FLAG(int, reconnect_s, 30,
          "watch: how long to keep trying to reach the controller before "
          "giving up (exit 3).");
ABSL_FLAG(std::string, state, "",
          "list: comma-separated states to show (QUEUED,RUNNING,...).");
ABSL_FLAG(int, page_size, 50, "list: jobs per page.");
ABSL_FLAG(std::string, page_token, "", "list: continue from this token.");
ABSL_FLAG(std::string, reason, "cancelled by user", "cancel: the reason.");
ABSL_FLAG(int, workers, 3, "up: number of worker daemons.");
ABSL_FLAG(std::string, data_dir, "",
          "up: data directory for the cluster (default: a new folder under "
          "/tmp).");
ABSL_FLAG(std::string, run, "",
          "up: submit this spec, watch it to the end, print its final eval "
          "metrics, then stop the cluster.");
ABSL_FLAG(std::string, tls_ca, "",
          "The cluster CA (PEM) the controller's certificate must chain to "
          "(default: $TRAINYARD_CA, else the system's roots).");
ABSL_FLAG(std::string, tls_server_name, "",
          "Check this name in the server's certificate instead of the host "
          "dialed.");
ABSL_FLAG(std::string, token_file, "",
          "File holding your bearer token (default: $TRAINYARD_TOKEN, else "
          "the file named by $TRAINYARD_TOKEN_FILE).");
ABSL_FLAG(bool, insecure, false,
          "Plaintext gRPC (a controller run with --insecure). `up`: run the "
          "local cluster without TLS or tokens.");
ABSL_FLAG(std::string, out, "",
          "certs: the folder to write into. trace: the file to write "
          "(default: JOB-step<N>.trace.json in the current folder).");
ABSL_FLAG(int64_t, step, 0,
          "trace: the step to show (default 0: the newest step every stage "
          "has reported).");
ABSL_FLAG(bool, follow, false,
          "logs: keep printing new lines until the job ends.");
ABSL_FLAG(std::string, hosts, "",
          "certs: comma-separated names and IPv4 addresses clients dial the "
          "controller by (localhost and 127.0.0.1 are always included).");
ABSL_FLAG(std::string, user, "", "token: the user the new token is for.");
ABSL_FLAG(std::string, role, "user", "token: \"user\" or \"admin\".");
ABSL_FLAG(std::string, tokens_file, "",
          "token: append the new token's hash to this tokens file (the "
          "controller picks it up within a second).");
ABSL_FLAG(std::string, address, "", "health: host:port to check.");
ABSL_FLAG(std::string, service, "",
          "health: the service name to check (\"\" = the server as a "
          "whole; trainyard.v1.WorkerRegistration = a worker registered).");
ABSL_FLAG(std::string, controller_bin, "",
          "up: trainyard-controller binary (default: next to this one, as "
          "Bazel lays them out).");
ABSL_FLAG(std::string, worker_bin, "",
          "up: trainyard-worker binary (default: as --controller_bin).");

namespace trainyard {
namespace {

constexpr char kUsage[] =
    "trainyard <command> [flags]\n\n"
    "commands:\n"
    "  train --spec FILE [--device cpu|cuda:N] [--precision P] [--stages N]\n"
    "                               run a job in this process\n"
    "  submit --spec FILE [--watch] submit a job to the controller\n"
    "  get JOB_ID                   show a job (JSON)\n"
    "  list [--state S,...]         list jobs\n"
    "  cancel JOB_ID                cancel a job\n"
    "  watch JOB_ID [--from_step N] follow a job's steps until it ends\n"
    "  logs JOB_ID [--follow]       the job's log lines from every worker "
    "(the newest\n"
    "                               10,000; --follow: until the job ends)\n"
    "  trace JOB_ID [--step N] [--out FILE]\n"
    "                               write one step's pipeline timeline as "
    "Chrome\n"
    "                               trace JSON (chrome://tracing, Perfetto); "
    "the\n"
    "                               newest 256 steps are kept\n"
    "  workers                      list the registered workers\n"
    "  up [--workers N] [--device D] [--run FILE] [--insecure]\n"
    "                               start a local cluster, TLS and tokens "
    "on (Ctrl-C stops it)\n"
    "  certs --out DIR [--hosts H,...]\n"
    "                               make a cluster CA, certificates, a "
    "tokens file and an admin token\n"
    "  token --user NAME [--role user|admin] [--tokens_file FILE]\n"
    "                               make a token for a user\n"
    "  health --address HOST:PORT [--service S]\n"
    "                               check a daemon's grpc.health.v1 (exit 0 "
    "when SERVING)\n"
    "  schedule --stages S --microbatches M --schedule NAME [--chunks V]\n"
    "           [--costs F,B,W] [--svg FILE] [--width N]\n"
    "                               print a pipeline schedule's actions, "
    "timeline,\n"
    "                               bubble and peak activations (no "
    "controller needed)\n\n"
    "Client commands reach --controller (or $TRAINYARD_CONTROLLER) over TLS "
    "with the CA in --tls_ca (or $TRAINYARD_CA) and the token in "
    "$TRAINYARD_TOKEN (or --token_file, $TRAINYARD_TOKEN_FILE); --insecure "
    "for a plaintext controller.\n";

// Bazel lays binaries out as bazel-bin/cli/trainyard,
// bazel-bin/controller/trainyard-controller and bazel-bin/worker/
// trainyard-worker.
std::string BazelBinDir() { return Dirname(ExecutableDir()); }

int Train() {
  const std::string spec_path = absl::GetFlag(FLAGS_spec);
  if (spec_path.empty()) {
    std::cerr << "trainyard train: --spec is required\n";
    return 2;
  }
  absl::StatusOr<trainyard::v1::JobSpec> spec = LoadJobSpecFile(spec_path);
  if (!spec.ok()) {
    std::cerr << "trainyard train: " << spec.status().message() << "\n";
    return 2;
  }
  // Flags that override the spec, for trying a job on another device.
  Device device = Device::Cpu();
  const std::string device_flag = absl::GetFlag(FLAGS_device);
  if (!device_flag.empty()) {
    absl::StatusOr<Device> d = ParseDevice(device_flag);
    if (!d.ok()) {
      std::cerr << "trainyard train: --device: " << d.status().message()
                << "\n";
      return 2;
    }
    device = *d;
    spec->set_device(device.KindName());
  } else if (spec->device() == "cuda") {
    device = Device::Cuda(0);
  } else if (spec->device() == "sim") {
    device = Device::Sim(0);
  }
  if (!absl::GetFlag(FLAGS_precision).empty()) {
    spec->set_precision(absl::GetFlag(FLAGS_precision));
  }
  if (absl::GetFlag(FLAGS_stages) != 0) {
    spec->mutable_parallelism()->set_stages(absl::GetFlag(FLAGS_stages));
    spec->mutable_parallelism()->clear_split();
  }
  PlanOptions plan_options;
  plan_options.base_dir = Dirname(spec_path);
  absl::StatusOr<JobPlan> plan = PlanJob(*spec, plan_options);
  if (!plan.ok()) {
    std::cerr << "trainyard train: " << spec_path << " is not a valid job:\n"
              << plan.status().message() << "\n";
    return 2;
  }

  std::ofstream file;
  std::ostream* out = &std::cout;
  const std::string metrics_path = absl::GetFlag(FLAGS_metrics_out);
  if (!metrics_path.empty()) {
    file.open(metrics_path, std::ios::out | std::ios::trunc);
    if (!file) {
      std::cerr << "trainyard train: --metrics_out " << metrics_path
                << ": cannot open for writing\n";
      return 2;
    }
    out = &file;
  }

  LocalJobOptions options;
  options.device = device;
  options.plugin_dir = absl::GetFlag(FLAGS_plugin_dir);
  if (options.plugin_dir.empty()) options.plugin_dir = DefaultPluginDir();
  options.threads = absl::GetFlag(FLAGS_threads);
  if (options.threads <= 0) {
    options.threads = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  }
  SetBlasThreads(options.threads);
  options.stop_after_step = absl::GetFlag(FLAGS_stop_after_step);
  options.timeout = absl::Seconds(std::max(1, absl::GetFlag(FLAGS_timeout_s)));
  options.on_step = [&](const StepReport& r, double seconds) {
    *out << StepJson(r, seconds) << std::endl;
  };
  options.on_eval = [&](int64_t step, const EvalReport& r) {
    *out << EvalJson(step, r) << std::endl;
  };
  options.on_log = [](const std::string& line) {
    std::cerr << "trainyard train: " << line << "\n";
  };
  options.on_checkpoint = [](int64_t step, const std::string& dir) {
    std::cerr << "trainyard train: checkpoint step " << step << " saved in "
              << dir << "\n";
  };
  std::cerr << "trainyard train: " << plan->spec.name() << ": "
            << plan->blocks.size() << " blocks, " << plan->num_stages()
            << " stage(s) x " << plan->spec.parallelism().replicas()
            << " replica(s), " << plan->spec.parallelism().microbatches()
            << " microbatch(es), " << plan->spec.steps() << " steps on "
            << device.ToString() << " in " << plan->spec.precision() << "; "
            << "memory estimate " << plan->memory.description << "; BLAS "
            << BlasDescription() << "\n";
  absl::Status st = RunLocalJob(*plan, options);
  if (!st.ok()) {
    std::cerr << "trainyard train: job failed: " << st.message() << "\n";
    return 1;
  }
  return 0;
}

// Set by SIGINT/SIGTERM in `trainyard up`.
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

std::string ControllerAddress() {
  std::string a = absl::GetFlag(FLAGS_controller);
  if (!a.empty()) return a;
  const char* env = std::getenv("TRAINYARD_CONTROLLER");
  return env != nullptr && *env != '\0' ? env : "127.0.0.1:7070";
}

std::string GetEnv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// The token: --token_file, else $TRAINYARD_TOKEN, else the file named by
// $TRAINYARD_TOKEN_FILE; "" when none is set.
absl::StatusOr<std::string> TokenFromFlags() {
  std::string file = absl::GetFlag(FLAGS_token_file);
  std::string what = "--token_file";
  if (file.empty()) {
    const std::string token = GetEnv("TRAINYARD_TOKEN");
    if (!token.empty()) {
      return std::string(absl::StripAsciiWhitespace(token));
    }
    file = GetEnv("TRAINYARD_TOKEN_FILE");
    what = "$TRAINYARD_TOKEN_FILE";
  }
  if (file.empty()) return std::string();
  absl::StatusOr<int64_t> size = FileSize(file);
  if (size.ok() && *size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", file, ": ", *size, " bytes; not a token"));
  }
  absl::StatusOr<std::string> text = ReadFileToString(file);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", file, ": ", text.status().message()));
  }
  return std::string(absl::StripAsciiWhitespace(*text));
}

absl::StatusOr<JobClientSecurity> SecurityFromFlags() {
  JobClientSecurity security;
  security.tls.insecure = absl::GetFlag(FLAGS_insecure);
  if (!security.tls.insecure) {
    security.tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
    if (security.tls.ca_file.empty()) {
      security.tls.ca_file = GetEnv("TRAINYARD_CA");
    }
    security.tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  }
  // Over plaintext no token is sent (JobClient drops it), so none is read.
  if (!security.tls.insecure) {
    ASSIGN_OR_RETURN(security.token, TokenFromFlags());
  }
  return security;
}

// A client for `address` (default: --controller) with the security flags;
// null after printing why not.
std::unique_ptr<JobClient> Connect(const char* command,
                                   const std::string& address) {
  absl::StatusOr<JobClientSecurity> security = SecurityFromFlags();
  absl::StatusOr<std::unique_ptr<JobClient>> client =
      security.ok()
          ? JobClient::Create(address, *security)
          : absl::StatusOr<std::unique_ptr<JobClient>>(security.status());
  if (!client.ok()) {
    std::cerr << "trainyard " << command << ": " << client.status().message()
              << "\n";
    return nullptr;
  }
  return *std::move(client);
}
std::unique_ptr<JobClient> Connect(const char* command) {
  return Connect(command, ControllerAddress());
}

int ReportRpcError(const char* command, const JobClient& client,
                   const absl::Status& st) {
  std::cerr << "trainyard " << command << ": " << client.address() << ": "
            << absl::StatusCodeToString(st.code()) << ": " << st.message()
            << "\n";
  if (absl::IsUnavailable(st)) {
    std::cerr << "trainyard " << command << ": no controller answers at "
              << client.address()
              << "; start trainyard-controller there, or point --controller "
                 "(or $TRAINYARD_CONTROLLER) at one\n";
    std::cerr << "trainyard " << command << ": "
              << (client.tls()
                      ? "this client speaks TLS: if the controller does too, "
                        "pass its CA with --tls_ca (or $TRAINYARD_CA); if it "
                        "runs with --insecure, pass --insecure"
                      : "this client speaks plaintext (--insecure): a "
                        "controller with TLS refuses it; pass its CA with "
                        "--tls_ca (or $TRAINYARD_CA) instead")
              << "\n";
  }
  if (absl::IsInvalidArgument(st) || absl::IsNotFound(st) ||
      absl::IsFailedPrecondition(st)) {
    return 2;
  }
  if (absl::IsUnauthenticated(st) || absl::IsPermissionDenied(st)) return 4;
  return 3;
}

// Prints a job's events: a live progress bar on a terminal, one plain line
// per step otherwise.
class WatchPrinter {
 public:
  WatchPrinter(int64_t total_steps, int64_t batch_size)
      : total_(total_steps), batch_(batch_size), tty_(isatty(1) != 0) {}

  void operator()(const trainyard::v1::JobEvent& e) {
    if (e.has_state()) {
      EndBar();
      std::cout << "job " << e.job_id() << ": "
                << JobStateName(e.state().state());
      if (!e.state().reason().empty()) std::cout << ": " << e.state().reason();
      std::cout << std::endl;
    } else if (e.has_step()) {
      const auto& m = e.step();
      const double rate = batch_ > 0 && m.samples_per_sec() > 0
                              ? m.samples_per_sec() / batch_
                              : 0;
      const double eta = rate > 0 ? (total_ - m.step()) / rate : -1;
      if (tty_) {
        const int width = 30;
        const int filled =
            total_ > 0 ? static_cast<int>(width * m.step() / total_) : 0;
        std::cout << "\r[" << std::string(filled, '#')
                  << std::string(width - filled, '-') << "] "
                  << absl::StrFormat(
                         "step %d/%d loss %.4f lr %.3g %.0f samples/s ETA %s",
                         m.step(), total_, m.loss(), m.lr(),
                         m.samples_per_sec(), FormatEta(eta))
                  << "\x1b[K" << std::flush;
        bar_open_ = true;
      } else {
        std::cout << absl::StrFormat(
                         "step %d/%d loss=%.6g lr=%.6g grad_norm=%.6g "
                         "samples_per_sec=%.1f eta=%s",
                         m.step(), total_, m.loss(), m.lr(), m.grad_norm(),
                         m.samples_per_sec(), FormatEta(eta))
                  << FormatMetrics(m.metrics(), "", m.loss()) << std::endl;
      }
    } else if (e.has_eval()) {
      EndBar();
      const auto& ev = e.eval();
      std::cout << absl::StrFormat("eval after step %d: loss=%.6g samples=%d",
                                   ev.step(), ev.loss(), ev.samples())
                << FormatMetrics(ev.metrics(), "", ev.loss()) << std::endl;
      last_eval_ = ev;
      has_eval_ = true;
    } else if (e.has_note()) {
      // What the service decided on the job's behalf (e.g. the transport
      // between its stages and why).
      EndBar();
      std::cout << "note (stage " << e.note().stage()
                << "): " << e.note().text() << std::endl;
    } else if (e.has_recovery()) {
      EndBar();
      const auto& r = e.recovery();
      std::cout << absl::StrFormat(
                       "restart %d: resumed after step %d (the loss was "
                       "noticed after step %d; rescheduled in %.2f s, "
                       "restored in %.2f s) on %s; cause: %s",
                       r.attempt(), r.resume_step(), r.detected_step(),
                       r.reschedule_s(), r.restore_s(),
                       absl::StrJoin(r.workers(), ","), r.cause())
                << std::endl;
    }
  }

  void EndBar() {
    if (bar_open_) std::cout << std::endl;
    bar_open_ = false;
  }

  bool has_eval() const { return has_eval_; }
  const trainyard::v1::EvalMetrics& last_eval() const { return last_eval_; }

 private:
  int64_t total_;
  int64_t batch_;
  bool tty_;
  bool bar_open_ = false;
  bool has_eval_ = false;
  trainyard::v1::EvalMetrics last_eval_;
};

// Watches to the end; exit status 0 only when the job SUCCEEDED. The
// printer (made from the job's spec) is handed to `done` afterwards.
int WatchToEnd(JobClient& client, const std::string& job_id, int64_t from_step,
               const std::function<void(const WatchPrinter&)>& done = nullptr,
               const std::atomic<bool>* stop = nullptr) {
  auto job = client.Get(job_id);
  if (!job.ok()) return ReportRpcError("watch", client, job.status());
  WatchPrinter printer(job->spec().steps(), job->spec().data().batch_size());
  auto end = client.Watch(
      job_id, from_step, [&](const trainyard::v1::JobEvent& e) { printer(e); },
      absl::Seconds(std::max(1, absl::GetFlag(FLAGS_reconnect_s))), stop);
  printer.EndBar();
  if (done) done(printer);
  if (!end.ok()) return ReportRpcError("watch", client, end.status());
  return end->state() == trainyard::v1::SUCCEEDED ? 0 : 1;
}

int Submit() {
  const std::string path = absl::GetFlag(FLAGS_spec);
  if (path.empty()) {
    std::cerr << "trainyard submit: --spec is required\n";
    return 2;
  }
  auto spec = ReadSpecForSubmit(path);
  if (!spec.ok()) {
    std::cerr << "trainyard submit: " << spec.status().message() << "\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("submit");
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  std::string request_id = absl::GetFlag(FLAGS_request_id);
  if (request_id.empty()) request_id = NewRequestId();
  auto job = client.Submit(*spec, request_id, absl::GetFlag(FLAGS_priority));
  if (!job.ok()) {
    const int rc = ReportRpcError("submit", client, job.status());
    if (absl::IsUnavailable(job.status()) ||
        absl::IsDeadlineExceeded(job.status())) {
      // The controller may have stored the job before the reply was lost:
      // the same request id returns that job instead of a second one.
      std::cerr << "trainyard submit: to retry without risking a duplicate "
                   "job, add --request_id "
                << request_id << "\n";
    }
    return rc;
  }
  std::cout << job->job_id() << std::endl;
  std::cerr << "trainyard submit: job " << job->job_id() << " "
            << JobStateName(job->state())
            << (job->reason().empty() ? "" : ": " + job->reason())
            << " (request id " << request_id << ")\n";
  if (!absl::GetFlag(FLAGS_watch)) return 0;
  return WatchToEnd(client, job->job_id(), 0);
}

// `trainyard get JOB --stages` (a bare flag, taken out of argv before the
// flags are parsed: --stages is also train's stage count).
bool g_get_stages = false;

// Per stage, the mean time of each phase over the job's published steps
// (replayed from its history), the measured bubble, and the schedule's own
// bubble (SimulatedBubble with equal forward, input- and weight-gradient
// costs).
int PrintStages(JobClient& client, const trainyard::v1::Job& job) {
  struct Sum {
    double forward = 0, backward = 0, comm = 0, idle = 0, optimizer = 0,
           loss = 0;
    int64_t syncs = 0, copy_bytes = 0;
    int64_t steps = 0;
  };
  std::map<int, Sum> sums;
  const int64_t last = job.steps_completed();
  if (last > 0) {
    std::atomic<bool> stop{false};
    absl::StatusOr<trainyard::v1::JobStateChange> watched = client.Watch(
        job.job_id(), 1,
        [&](const trainyard::v1::JobEvent& e) {
          if (!e.has_step() || e.step().step() > last) return;
          for (const trainyard::v1::StageTiming& t : e.step().stages()) {
            Sum& s = sums[t.stage()];
            s.forward += t.forward_s();
            s.backward += t.backward_s();
            s.comm += t.comm_s();
            s.idle += t.idle_s();
            s.optimizer += t.optimizer_s();
            s.loss += t.loss_s();
            s.syncs += t.syncs();
            s.copy_bytes += t.h2d_bytes() + t.d2h_bytes();
            ++s.steps;
          }
          if (e.step().step() >= last) stop.store(true);
        },
        absl::Seconds(10), &stop);
    if (!watched.ok() && !absl::IsCancelled(watched.status())) {
      return ReportRpcError("get --stages", client, watched.status());
    }
  }
  absl::StatusOr<JobPlan> plan = PlanJob(job.spec(), PlanOptions::ShapeOnly());
  const auto& par =
      plan.ok() ? plan->spec.parallelism() : job.spec().parallelism();
  std::cout << absl::StrFormat(
      "job %s: %d step(s); %d stage(s), schedule %s, %d microbatch(es)\n",
      job.job_id(), last, par.stages(), par.schedule(), par.microbatches());
  std::cout << absl::StrFormat(
      "%-6s %11s %12s %8s %8s %13s %8s %8s %7s %6s %11s\n", "stage",
      "forward_ms", "backward_ms", "loss_ms", "comm_ms", "idle_ms",
      "optimizer_ms", "step_ms", "bubble", "syncs", "copied_kib");
  double bubble_sum = 0;
  for (const auto& [stage, s] : sums) {
    const double n = static_cast<double>(std::max<int64_t>(1, s.steps));
    const double total =
        s.forward + s.backward + s.loss + s.comm + s.idle + s.optimizer;
    const double bubble = total > 0 ? s.idle / total : 0;
    bubble_sum += bubble;
    std::cout << absl::StrFormat(
        "%-6d %11.3f %12.3f %8.3f %8.3f %8.3f %13.3f %8.3f %7.3f %6.1f "
        "%11.1f\n",
        stage, 1e3 * s.forward / n, 1e3 * s.backward / n, 1e3 * s.loss / n,
        1e3 * s.comm / n, 1e3 * s.idle / n, 1e3 * s.optimizer / n,
        1e3 * total / n, bubble, s.syncs / n, s.copy_bytes / n / 1024);
  }

  if (!sums.empty()) {
    std::cout << absl::StrFormat("measured bubble (mean over stages): %.3f\n",
                                 bubble_sum / sums.size());
  }
  absl::StatusOr<Schedule> sched = MakeTrainingSchedule(
      par.schedule().empty() ? "1f1b" : par.schedule(),
      std::max(1, par.stages()),
      std::max(1, par.microbatches() / std::max(1, par.replicas())),
      par.chunks());
  absl::StatusOr<double> own = sched.ok()
                                   ? SimulatedBubble(*sched)
                                   : absl::StatusOr<double>(sched.status());
  if (own.ok()) {
    std::cout << absl::StrFormat(
        "the schedule's own bubble: %.3f (equal forward, input-gradient and "
        "weight-gradient times, free messages)\n",
        *own);
  }
  return 0;
}

int Get(const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: trainyard get JOB_ID [--stages]\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("get");
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto job = client.Get(args[2]);
  if (!job.ok()) return ReportRpcError("get", client, job.status());
  if (g_get_stages) return PrintStages(client, *job);
  std::cout << ToJson(*job);
  return 0;
}

int List() {
  std::vector<trainyard::v1::JobState> states;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_state), ',', absl::SkipEmpty())) {
    trainyard::v1::JobState s;
    if (!trainyard::v1::JobState_Parse(std::string(name), &s)) {
      std::cerr
          << "trainyard list: --state: unknown state \"" << name
          << "\" (QUEUED, RUNNING, RECOVERING, SUCCEEDED, FAILED, CANCELLED)\n";
      return 2;
    }
    states.push_back(s);
  }
  std::unique_ptr<JobClient> connected = Connect("list");
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto resp = client.List(states, absl::GetFlag(FLAGS_page_size),
                          absl::GetFlag(FLAGS_page_token));
  if (!resp.ok()) return ReportRpcError("list", client, resp.status());
  std::cout << absl::StrFormat("%-24s %-10s %-24s %11s  %s\n", "JOB", "STATE",
                               "NAME", "STEPS", "REASON");
  for (const auto& job : resp->jobs()) {
    std::cout << absl::StrFormat("%-24s %-10s %-24s %5d/%-5d  %s\n",
                                 job.job_id(), JobStateName(job.state()),
                                 job.spec().name(), job.steps_completed(),
                                 job.spec().steps(), job.reason());
  }
  if (!resp->next_page_token().empty()) {
    std::cout << "more: --page_token=" << resp->next_page_token() << "\n";
  }
  return 0;
}

int Cancel(const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: trainyard cancel JOB_ID [--reason TEXT]\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("cancel");
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto job = client.Cancel(args[2], absl::GetFlag(FLAGS_reason));
  if (!job.ok()) return ReportRpcError("cancel", client, job.status());
  std::cout << job->job_id() << " " << JobStateName(job->state()) << "\n";
  return 0;
}

int Workers() {
  std::unique_ptr<JobClient> connected = Connect("workers");
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto resp = client.ListWorkers();
  if (!resp.ok()) return ReportRpcError("workers", client, resp.status());
  std::cout << absl::StrFormat("%-8s %-16s %-8s %-22s %-14s %s\n", "WORKER",
                               "NAME", "DEVICE", "PEER", "JOB", "HEARTBEAT");
  for (const auto& w : resp->workers()) {
    const std::string job =
        w.job_id().empty() ? "idle" : absl::StrCat(w.job_id(), "/", w.stage());
    std::cout << absl::StrFormat(
        "%-8s %-16s %-8s %-22s %-14s %d ms ago\n", w.worker_id(), w.name(),
        w.capabilities().device(), w.capabilities().peer_address(), job,
        w.last_heartbeat_ms_ago());
  }
  return 0;
}

// Waits until `count` workers have registered (bounded).
// Gives up at once when a child process died (`cluster`'s reason).
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

int Watch(const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: trainyard watch JOB_ID [--from_step N]\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("watch");
  if (connected == nullptr) return 2;
  return WatchToEnd(*connected, args[2], absl::GetFlag(FLAGS_from_step));
}

int Logs(const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: trainyard logs JOB_ID [--follow]\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("logs");
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  int64_t expected = 0;  // the seq the next line should have
  absl::Status st = client.WatchLogs(
      args[2], absl::GetFlag(FLAGS_follow),
      [&](const trainyard::v1::LogLine& l) {
        if (l.seq() > expected) {
          std::cout << "(" << l.seq() - expected
                    << " line(s) no longer held by the controller)\n";
        }
        expected = l.seq() + 1;
        std::cout << FormatLogLine(l) << std::endl;
      },
      absl::Seconds(std::max(1, absl::GetFlag(FLAGS_reconnect_s))));
  if (!st.ok()) return ReportRpcError("logs", client, st);
  return 0;
}

int Trace(const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: trainyard trace JOB_ID [--step N] [--out FILE]\n";
    return 2;
  }
  const int64_t step = absl::GetFlag(FLAGS_step);
  if (step < 0) {
    std::cerr << "trainyard trace: --step must be >= 0 (0 = the newest), got "
              << step << "\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("trace");
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto trace = client.GetTrace(args[2], step);
  if (!trace.ok()) return ReportRpcError("trace", client, trace.status());
  std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    out = absl::StrCat(trace->job_id(), "-step", trace->step(), ".trace.json");
  }
  absl::Status written = WriteFileAtomically(out, ChromeTraceJson(*trace));
  if (!written.ok()) {
    std::cerr << "trainyard trace: --out " << out << ": " << written.message()
              << "\n";
    return 1;
  }
  int spans = 0;
  std::vector<std::string> missing;
  std::set<int> have;
  for (const auto& st : trace->stages()) {
    spans += st.spans_size();
    have.insert(st.stage());
    if (st.truncated()) {
      std::cerr << "trainyard trace: stage " << st.stage()
                << " did more than the span limit allows; its trace is cut\n";
    }
  }
  for (int k = 0; k < trace->num_stages(); ++k) {
    if (have.count(k) == 0) missing.push_back(absl::StrCat(k));
  }
  if (!missing.empty()) {
    std::cerr << "trainyard trace: stage(s) " << absl::StrJoin(missing, ", ")
              << " have not reported step " << trace->step() << " (yet)\n";
  }
  std::cerr << "trainyard trace: wrote " << out << ": step " << trace->step()
            << " of " << trace->job_id() << ", " << trace->stages_size()
            << " stage(s), " << spans << " spans (steps "
            << trace->oldest_step() << ".." << trace->newest_step()
            << " are held). Open it in chrome://tracing or "
               "https://ui.perfetto.dev; each stage is drawn from its own "
               "step start (no clock sync between machines).\n";
  std::cout << out << "\n";
  return 0;
}

int Up() {
  LocalClusterOptions opts;
  const std::string bazel_bin = BazelBinDir();
  opts.controller_bin = absl::GetFlag(FLAGS_controller_bin);
  if (opts.controller_bin.empty()) {
    opts.controller_bin = bazel_bin + "/controller/trainyard-controller";
  }
  opts.worker_bin = absl::GetFlag(FLAGS_worker_bin);
  if (opts.worker_bin.empty())
    opts.worker_bin = bazel_bin + "/worker/trainyard-worker";
  opts.plugin_dir = absl::GetFlag(FLAGS_plugin_dir);
  if (opts.plugin_dir.empty()) opts.plugin_dir = DefaultPluginDir();
  opts.workers = absl::GetFlag(FLAGS_workers);
  if (opts.workers < 1) {
    std::cerr << "trainyard up: --workers must be >= 1\n";
    return 2;
  }
  if (!absl::GetFlag(FLAGS_device).empty()) {
    absl::StatusOr<Device> d = ParseDevice(absl::GetFlag(FLAGS_device));
    if (!d.ok()) {
      std::cerr << "trainyard up: --device: " << d.status().message() << "\n";
      return 2;
    }
    opts.device = d->ToString();
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  opts.threads_per_worker =
      std::max<int>(1, static_cast<int>(cores) / opts.workers);
  opts.data_dir = absl::GetFlag(FLAGS_data_dir);
  if (opts.data_dir.empty()) {
    char tmpl[] = "/tmp/trainyard-up-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::cerr << "trainyard up: cannot create a data directory in /tmp\n";
      return 1;
    }
    opts.data_dir = tmpl;
  }
  // Parse the job first: a bad spec should not cost a cluster start.
  const std::string run_path = absl::GetFlag(FLAGS_run);
  std::optional<trainyard::v1::JobSpec> run_spec;
  if (!run_path.empty()) {
    auto spec = ReadSpecForSubmit(run_path);
    if (!spec.ok()) {
      std::cerr << "trainyard up: --run: " << spec.status().message() << "\n";
      return 2;
    }
    run_spec = *std::move(spec);
    if (!absl::GetFlag(FLAGS_device).empty()) {
      run_spec->set_device(ParseDevice(opts.device)->KindName());
    } else if (run_spec->device() == "cuda") {
      opts.device = "cuda:0";  // a cuda job needs cuda workers
    } else if (run_spec->device() == "sim") {
      opts.device = "sim:0";
    }
  }
  opts.insecure = absl::GetFlag(FLAGS_insecure);
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  LocalCluster cluster(opts);
  if (absl::Status st = cluster.Start(); !st.ok()) {
    std::cerr << "trainyard up: " << st.message() << "\n";
    return 1;
  }
  JobClientSecurity security;
  security.tls.insecure = opts.insecure;
  security.tls.ca_file = cluster.credentials().ca_cert;
  security.token = cluster.credentials().admin_token_value;
  absl::StatusOr<std::unique_ptr<JobClient>> connected =
      JobClient::Create(cluster.controller_address(), security);
  if (!connected.ok()) {
    std::cerr << "trainyard up: " << connected.status().message() << "\n";
    return 1;
  }
  JobClient& client = **connected;
  if (absl::Status st =
          WaitForWorkers(client, opts.workers, opts.start_timeout, &cluster);
      !st.ok()) {
    std::cerr << "trainyard up: " << st.message() << "; see the logs in "
              << opts.data_dir << "/logs\n";
    cluster.Stop();
    return 1;
  }
  std::cerr << "trainyard up: controller at " << cluster.controller_address()
            << ", " << opts.workers << " workers registered; data and logs in "
            << opts.data_dir << "\n";
  if (opts.insecure) {
    std::cerr << "trainyard up: --insecure: plaintext, no tokens; anyone on "
                 "this machine can use the cluster\n";
  } else {
    std::cerr << "trainyard up: TLS, worker certificates and tokens are on "
                 "(throw-away CA in "
              << opts.data_dir
              << "/pki); to use this cluster from another shell:\n"
              << "  export TRAINYARD_CONTROLLER="
              << cluster.controller_address() << "\n"
              << "  export TRAINYARD_CA=" << cluster.credentials().ca_cert
              << "\n"
              << "  export TRAINYARD_TOKEN_FILE="
              << cluster.credentials().admin_token << "\n"
              << "  (more users: trainyard token --user NAME --tokens_file "
              << cluster.credentials().tokens << ")\n";
  }
  if (!run_spec.has_value()) {
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
  auto job = client.Submit(*run_spec, NewRequestId(), 0);
  if (!job.ok()) {
    int rc = ReportRpcError("up", client, job.status());
    cluster.Stop();
    return rc;
  }
  std::cerr << "trainyard up: submitted " << job->job_id() << " ("
            << run_spec->name() << ", " << run_spec->parallelism().stages()
            << " stages)\n";
  auto print_final = [](const WatchPrinter& p) {
    if (!p.has_eval()) return;
    const auto& ev = p.last_eval();
    auto it = ev.metrics().find("accuracy");
    std::cout << "final eval after step " << ev.step() << ": loss "
              << absl::StrFormat("%.4f", ev.loss());
    if (it != ev.metrics().end()) {
      std::cout << ", accuracy " << absl::StrFormat("%.4f", it->second);
    }
    std::cout << std::endl;
  };
  int rc = WatchToEnd(client, job->job_id(), 0, print_final, &g_stop);
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

int Certs() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::cerr << "usage: trainyard certs --out DIR [--hosts NAME,...]\n";
    return 2;
  }
  std::vector<std::string> hosts =
      absl::StrSplit(absl::GetFlag(FLAGS_hosts), ',', absl::SkipWhitespace());
  absl::StatusOr<ClusterCredentials> creds =
      WriteClusterCredentials(out, hosts, /*overwrite=*/false);
  if (!creds.ok()) {
    std::cerr << "trainyard certs: " << creds.status().message() << "\n";
    return 1;
  }
  std::cout << "controller: --tls_cert=" << creds->controller_cert
            << " --tls_key=" << creds->controller_key
            << " --tls_ca=" << creds->ca_cert
            << " --tokens_file=" << creds->tokens << "\n"
            << "workers:    --tls_cert=" << creds->worker_cert
            << " --tls_key=" << creds->worker_key
            << " --tls_ca=" << creds->ca_cert << "\n"
            << "clients:    export TRAINYARD_CA=" << creds->ca_cert
            << " TRAINYARD_TOKEN_FILE=" << creds->admin_token << "\n"
            << "keep " << creds->ca_key
            << " offline: whoever holds it can mint worker certificates\n";
  return 0;
}

int Token() {
  const std::string user = absl::GetFlag(FLAGS_user);
  const std::string role_name = absl::GetFlag(FLAGS_role);
  if (user.empty()) {
    std::cerr << "usage: trainyard token --user NAME [--role user|admin] "
                 "[--tokens_file FILE]\n";
    return 2;
  }
  if (role_name != "user" && role_name != "admin") {
    std::cerr << "trainyard token: --role must be \"user\" or \"admin\", "
                 "got \""
              << role_name << "\"\n";
    return 2;
  }
  const Role role = role_name == "admin" ? Role::kAdmin : Role::kUser;
  const std::string token = NewToken();
  absl::StatusOr<std::string> line = TokensFileLine(user, role, token);
  if (!line.ok()) {
    std::cerr << "trainyard token: " << line.status().message() << "\n";
    return 2;
  }
  const std::string tokens_file = absl::GetFlag(FLAGS_tokens_file);
  if (!tokens_file.empty()) {
    absl::Status st = AppendToken(tokens_file, user, role, token);
    if (!st.ok()) {
      std::cerr << "trainyard token: " << st.message() << "\n";
      return 1;
    }
    std::cerr << "trainyard token: added " << role_name << " \"" << user
              << "\" to " << tokens_file
              << "; give them the token below (it is not stored)\n";
  } else {
    std::cerr << "trainyard token: add this line to the controller's "
                 "--tokens_file, and give the token below to "
              << user << ":\n"
              << *line;
  }
  std::cout << token << "\n";
  return 0;
}

int Health() {
  const std::string address = absl::GetFlag(FLAGS_address);
  if (address.empty()) {
    std::cerr << "usage: trainyard health --address HOST:PORT [--service S] "
                 "[--tls_ca FILE | --insecure]\n";
    return 2;
  }
  absl::StatusOr<JobClientSecurity> security = SecurityFromFlags();
  if (!security.ok()) {
    std::cerr << "trainyard health: " << security.status().message() << "\n";
    return 2;
  }
  grpc::ChannelArguments args;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      MakeChannelCredentials(security->tls, &args);
  if (!creds.ok()) {
    std::cerr << "trainyard health: " << creds.status().message() << "\n";
    return 2;
  }
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateCustomChannel(address, *creds, args));
  grpc::ClientContext ctx;
  // Under Kubernetes' default probe timeout (5 s).
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(4));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status st = stub->Check(&ctx, req, &resp);
  if (!st.ok()) {
    std::cerr << "trainyard health: " << address << ": "
              << absl::StatusCodeToString(
                     static_cast<absl::StatusCode>(st.error_code()))
              << ": " << st.error_message() << "\n";
    return 1;
  }
  const std::string name =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
  std::cout << name << "\n";
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0
                                                                         : 1;
}

// `trainyard schedule`: a schedule as data, simulated. Needs no controller.
int ScheduleCommand() {
  const int S = absl::GetFlag(FLAGS_stages);
  const int M = absl::GetFlag(FLAGS_microbatches);
  const std::string name = absl::GetFlag(FLAGS_schedule);
  if (S < 1 || M < 1) {
    std::cerr << "usage: trainyard schedule --stages S --microbatches M "
                 "--schedule NAME [--chunks V] [--costs F,B,W] [--svg FILE] "
                 "[--width N]\n"
                 "trainyard schedule: --stages and --microbatches must be "
                 ">= 1, got "
              << S << " and " << M << "\n";
    return 2;
  }
  PassCosts costs;
  if (const std::string job_id = absl::GetFlag(FLAGS_costs_from);
      !job_id.empty()) {
    std::unique_ptr<JobClient> client = Connect("schedule");
    if (client == nullptr) return 2;
    auto trace = client->GetTrace(job_id, 0);
    if (!trace.ok()) return ReportRpcError("schedule", *client, trace.status());
    // Whole-stage costs per microbatch: a stage with v chunks has v spans
    // of each kind per microbatch, so divide by the microbatches it ran.
    double sum[3] = {0, 0, 0};
    int n[3] = {0, 0, 0};
    for (const auto& stage : trace->stages()) {
      std::set<int> microbatches[3];
      for (const auto& span : stage.spans()) {
        const int k = span.kind() == trainyard::v1::SPAN_FORWARD           ? 0
                      : span.kind() == trainyard::v1::SPAN_BACKWARD_INPUT  ? 1
                      : span.kind() == trainyard::v1::SPAN_BACKWARD_WEIGHT ? 2
                                                                           : -1;
        if (k < 0) continue;
        sum[k] += static_cast<double>(span.end_us() - span.start_us()) / 1e3;
        microbatches[k].insert(span.microbatch());
      }
      for (int k = 0; k < 3; ++k) n[k] += microbatches[k].size();
    }
    if (n[0] == 0 || n[1] == 0 || n[2] == 0) {
      std::cerr << "trainyard schedule: --costs_from " << job_id << ": step "
                << trace->step()
                << " has no forward, input- and weight-gradient spans\n";
      return 1;
    }
    costs = PassCosts{sum[0] / n[0], sum[1] / n[1], sum[2] / n[2]};
    std::cout << absl::StrFormat(
        "costs from %s step %d (mean per microbatch over %d stage(s)): "
        "F %.3f ms, B %.3f ms, W %.3f ms\n",
        job_id, trace->step(), trace->stages_size(), costs.forward,
        costs.backward_input, costs.backward_weight);
  } else {
    const std::string text = absl::GetFlag(FLAGS_costs);
    std::vector<std::string> parts = absl::StrSplit(text, ',');
    double v[3];
    bool ok = parts.size() == 3;
    for (size_t i = 0; ok && i < 3; ++i) {
      ok =
          absl::SimpleAtod(parts[i], &v[i]) && std::isfinite(v[i]) && v[i] >= 0;
    }
    if (!ok || v[0] + v[1] + v[2] <= 0) {
      std::cerr << "trainyard schedule: --costs: expected F,B,W, three "
                   "finite times >= 0 (not all 0), got \""
                << text << "\"\n";
      return 2;
    }
    costs = PassCosts{v[0], v[1], v[2]};
  }
  absl::StatusOr<Schedule> sched =
      MakeTrainingSchedule(name, S, M, absl::GetFlag(FLAGS_chunks), costs);
  if (!sched.ok()) {
    std::cerr << "trainyard schedule: " << sched.status().message() << "\n";
    return 2;
  }
  if (absl::Status valid = ValidateSchedule(*sched); !valid.ok()) {
    std::cerr << "trainyard schedule: " << valid.message() << "\n";
    return 1;
  }
  absl::StatusOr<ScheduleSimulation> sim = SimulateSchedule(*sched, costs);
  if (!sim.ok()) {
    std::cerr << "trainyard schedule: " << sim.status().message() << "\n";
    return 1;
  }
  const int v = sched->num_chunks;
  std::cout << absl::StrFormat(
      "schedule %s: %d stage(s), %d microbatch(es), %d chunk(s) per stage",
      sched->name, S, M, v);
  if (v > 1 && sched->layout == ChunkLayout::kV) {
    std::cout << absl::StrFormat(
        " (V: stage s holds virtual stages s and %d-s; loss on stage 0 "
        "chunk 1)",
        2 * S - 1);
  } else if (v > 1) {
    std::cout << absl::StrFormat(
        " (loop: chunk c of stage s is virtual stage c*%d+s)", S);
  }
  std::cout << absl::StrFormat(
      "\ncosts per microbatch on a whole stage: forward %g, input gradient "
      "%g, weight gradient %g",
      costs.forward, costs.backward_input, costs.backward_weight);
  if (v > 1) std::cout << absl::StrFormat(" (a chunk pass: 1/%d of that)", v);
  std::cout << "\nvalid: every send received, no deadlock, weight gradients "
               "in ascending microbatch order per chunk\n\nactions:\n"
            << sched->ToString() << "\ntimeline:\n"
            << RenderTextTimeline(*sched, *sim, absl::GetFlag(FLAGS_width))
            << "\n";
  std::cout << absl::StrFormat("%-6s %8s %8s %8s %16s\n", "stage", "busy",
                               "idle", "bubble", "peak_in_flight");
  for (int s = 0; s < S; ++s) {
    std::string peak = absl::StrFormat("%.4g", sim->peak_in_flight[s]);
    if (v > 1) {
      absl::StrAppendFormat(&peak, " (%d chunks)",
                            sim->peak_chunk_activations[s]);
    }
    std::cout << absl::StrFormat(
        "%-6d %8g %8g %8.4f %16s\n", s, sim->busy[s], sim->idle[s],
        sim->makespan > 0 ? sim->idle[s] / sim->makespan : 0.0, peak);
  }
  std::cout << absl::StrFormat(
      "step %g; bubble %.4f of the step (idle / (idle + busy), mean over "
      "stages), %.4f of compute (idle / busy)\n"
      "peak_in_flight: microbatches whose activations a stage holds at once "
      "(forward to weight pass), in whole-stage microbatches\n",
      sim->makespan, sim->bubble, sim->bubble_of_compute);
  const std::string svg = absl::GetFlag(FLAGS_svg);
  if (!svg.empty()) {
    std::ofstream f(svg, std::ios::binary | std::ios::trunc);
    f << RenderSvgTimeline(*sched, *sim);
    f.close();
    if (!f) {
      std::cerr << "trainyard schedule: --svg: cannot write " << svg << "\n";
      return 1;
    }
    std::cerr << "trainyard schedule: wrote " << svg << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(trainyard::kUsage);
  if (argc > 1 && std::string(argv[1]) == "get") {
    // `get JOB --stages` is a bare switch; train's --stages takes a number.
    int out = 1;
    for (int i = 1; i < argc; ++i) {
      if (std::string(argv[i]) == "--stages") {
        trainyard::g_get_stages = true;
      } else {
        argv[out++] = argv[i];
      }
    }
    argc = out;
  }
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::cerr << trainyard::kUsage;
    return 2;
  }
  const std::string command = args[1];
  if (command == "train") return trainyard::Train();
  if (command == "submit") return trainyard::Submit();
  if (command == "get") return trainyard::Get(args);
  if (command == "list") return trainyard::List();
  if (command == "cancel") return trainyard::Cancel(args);
  if (command == "watch") return trainyard::Watch(args);
  if (command == "workers") return trainyard::Workers();
  if (command == "logs") return trainyard::Logs(args);
  if (command == "trace") return trainyard::Trace(args);
  if (command == "up") return trainyard::Up();
  if (command == "certs") return trainyard::Certs();
  if (command == "token") return trainyard::Token();
  if (command == "health") return trainyard::Health();
  if (command == "schedule") return trainyard::ScheduleCommand();
  std::cerr << "trainyard: unknown command \"" << command << "\"\n"
            << trainyard::kUsage;
  return 2;
}
