// trainyard: the command-line client. See kUsage below and the README's CLI
// reference. This file defines the flags (absl's --help lists the flags of
// the binary's main file), reads them into CliFlags and runs the command.
//
// Exit status: 0 success (for watch/submit --watch/up --run: the job
// SUCCEEDED), 1 a failure while running (or the job ended FAILED or
// CANCELLED), 2 bad usage or a bad spec, 3 the controller could not be
// reached or refused the call, 4 a missing or refused token.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/chrome_trace.h"
#include "cli/cli_flags.h"
#include "cli/job_client.h"
#include "cli/job_format.h"
#include "cli/local_cluster.h"
#include "cli/submit_spec.h"
#include "core/device.h"
#include "core/file_util.h"
#include "core/status_macros.h"
#include "engine/local_job.h"
#include "engine/task_loader.h"
#include "grpcpp/grpcpp.h"
#include "kernels/blas.h"
#include "plan/job_plan.h"
#include "proto/health.grpc.pb.h"
#include "proto/trainyard.pb.h"
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

// How a `trainyard` command reaches a daemon: the controller's address, TLS
// and the bearer token from the flags and the environment (README,
// "Security model"), and the one way every command reports a failed call.

// --controller, else $TRAINYARD_CONTROLLER, else 127.0.0.1:7070.
std::string ControllerAddress(const CliFlags& flags);

// The token: --token_file, else $TRAINYARD_TOKEN, else the file named by
// $TRAINYARD_TOKEN_FILE; "" when none is set. InvalidArgument naming the
// flag or variable and the file when the file is unreadable or too large to
// be a token.
absl::StatusOr<std::string> TokenFromFlags(const CliFlags& flags);

// TLS (--insecure, --tls_ca or $TRAINYARD_CA, --tls_server_name) and, over
// TLS only, the token.
absl::StatusOr<JobClientSecurity> SecurityFromFlags(const CliFlags& flags);

// How long a stream keeps trying to reach the controller again (--reconnect_s,
// at least one second).
absl::Duration ReconnectWindow(const CliFlags& flags);

// A client for ControllerAddress with the security flags; null after
// printing "trainyard <command>: <why>" to stderr.
std::unique_ptr<JobClient> Connect(const char* command, const CliFlags& flags);

// Prints a failed call to stderr (with a hint when no controller answers)
// and returns the exit status for it: 2 for a bad request or an unknown
// job, 4 for a missing or refused token, else 3.
int ReportRpcError(const char* command, const JobClient& client,
                   const absl::Status& st);

std::string GetEnv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string ControllerAddress(const CliFlags& flags) {
  std::string a = flags.controller;
  if (!a.empty()) return a;
  const char* env = std::getenv("TRAINYARD_CONTROLLER");
  return env != nullptr && *env != '\0' ? env : "127.0.0.1:7070";
}

absl::StatusOr<std::string> TokenFromFlags(const CliFlags& flags) {
  std::string file = flags.token_file;
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

absl::StatusOr<JobClientSecurity> SecurityFromFlags(const CliFlags& flags) {
  JobClientSecurity security;
  security.tls.insecure = flags.insecure;
  if (!security.tls.insecure) {
    security.tls.ca_file = flags.tls_ca;
    if (security.tls.ca_file.empty()) {
      security.tls.ca_file = GetEnv("TRAINYARD_CA");
    }
    security.tls.server_name = flags.tls_server_name;
  }
  // Over plaintext no token is sent (JobClient drops it), so none is read.
  if (!security.tls.insecure) {
    ASSIGN_OR_RETURN(security.token, TokenFromFlags(flags));
  }
  return security;
}

absl::Duration ReconnectWindow(const CliFlags& flags) {
  return absl::Seconds(std::max(1, flags.reconnect_s));
}

std::unique_ptr<JobClient> Connect(const char* command, const CliFlags& flags) {
  absl::StatusOr<JobClientSecurity> security = SecurityFromFlags(flags);
  absl::StatusOr<std::unique_ptr<JobClient>> client =
      security.ok()
          ? JobClient::Create(ControllerAddress(flags), *security)
          : absl::StatusOr<std::unique_ptr<JobClient>>(security.status());
  if (!client.ok()) {
    std::cerr << "trainyard " << command << ": " << client.status().message()
              << "\n";
    return nullptr;
  }
  return *std::move(client);
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

// Following a job to its end as `trainyard watch`, `submit --watch` and
// `up --run` do: WatchPrinter prints the job's events, WatchToEnd streams
// them (JobClient::Watch) and turns the job's end into an exit status.

// Prints a job's events to stdout: a live progress bar on a terminal, one
// plain line per step otherwise; states, evals, notes and restarts on lines
// of their own. Remembers the newest eval.
class WatchPrinter {
 public:
  WatchPrinter(int64_t total_steps, int64_t batch_size);

  void operator()(const trainyard::v1::JobEvent& e);
  // Ends the progress bar's line, if one is open.
  void EndBar();

  bool has_eval() const { return has_eval_; }
  const trainyard::v1::EvalMetrics& last_eval() const { return last_eval_; }

 private:
  void PrintStep(const trainyard::v1::StepMetrics& m);
  void PrintRecovery(const trainyard::v1::JobRecovery& r);

  int64_t total_;
  int64_t batch_;
  bool tty_;
  bool bar_open_ = false;
  bool has_eval_ = false;
  trainyard::v1::EvalMetrics last_eval_;
};

// Watches the job from `from_step` to its end, printing its events with a
// WatchPrinter made from the job's spec, and hands the printer to `done`
// (when set) afterwards. `reconnect` and `stop` are JobClient::Watch's.
// Returns 0 only when the job SUCCEEDED, 1 when it ended otherwise, or
// ReportRpcError's status when a call failed.
int WatchToEnd(JobClient& client, const std::string& job_id, int64_t from_step,
               absl::Duration reconnect,
               const std::function<void(const WatchPrinter&)>& done = nullptr,
               const std::atomic<bool>* stop = nullptr);

WatchPrinter::WatchPrinter(int64_t total_steps, int64_t batch_size)
    : total_(total_steps), batch_(batch_size), tty_(isatty(1) != 0) {}

void WatchPrinter::operator()(const trainyard::v1::JobEvent& e) {
  if (e.has_state()) {
    EndBar();
    std::cout << "job " << e.job_id() << ": "
              << JobStateName(e.state().state());
    if (!e.state().reason().empty()) std::cout << ": " << e.state().reason();
    std::cout << std::endl;
  } else if (e.has_step()) {
    PrintStep(e.step());
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
    std::cout << "note (stage " << e.note().stage() << "): " << e.note().text()
              << std::endl;
  } else if (e.has_recovery()) {
    EndBar();
    PrintRecovery(e.recovery());
  }
}

void WatchPrinter::PrintStep(const trainyard::v1::StepMetrics& m) {
  const double rate =
      batch_ > 0 && m.samples_per_sec() > 0 ? m.samples_per_sec() / batch_ : 0;
  const double eta = rate > 0 ? (total_ - m.step()) / rate : -1;
  if (tty_) {
    const int width = 30;
    const int filled =
        total_ > 0 ? static_cast<int>(width * m.step() / total_) : 0;
    std::cout << "\r[" << std::string(filled, '#')
              << std::string(width - filled, '-') << "] "
              << absl::StrFormat(
                     "step %d/%d loss %.4f lr %.3g %.0f samples/s ETA %s",
                     m.step(), total_, m.loss(), m.lr(), m.samples_per_sec(),
                     FormatEta(eta))
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
}

void WatchPrinter::PrintRecovery(const trainyard::v1::JobRecovery& r) {
  std::cout << absl::StrFormat(
                   "restart %d: resumed after step %d (the loss was noticed "
                   "after step %d; rescheduled in %.2f s, restored in %.2f s) "
                   "on %s; cause: %s",
                   r.attempt(), r.resume_step(), r.detected_step(),
                   r.reschedule_s(), r.restore_s(),
                   absl::StrJoin(r.workers(), ","), r.cause())
            << std::endl;
}

void WatchPrinter::EndBar() {
  if (bar_open_) std::cout << std::endl;
  bar_open_ = false;
}

int WatchToEnd(JobClient& client, const std::string& job_id, int64_t from_step,
               absl::Duration reconnect,
               const std::function<void(const WatchPrinter&)>& done,
               const std::atomic<bool>* stop) {
  auto job = client.Get(job_id);
  if (!job.ok()) return ReportRpcError("watch", client, job.status());
  WatchPrinter printer(job->spec().steps(), job->spec().data().batch_size());
  auto end = client.Watch(
      job_id, from_step, [&](const trainyard::v1::JobEvent& e) { printer(e); },
      reconnect, stop);
  printer.EndBar();
  if (done) done(printer);
  if (!end.ok()) return ReportRpcError("watch", client, end.status());
  return end->state() == trainyard::v1::SUCCEEDED ? 0 : 1;
}

// `trainyard get JOB --stages`: per stage, the mean time of each phase over
// the job's published steps (replayed from its history), the measured
// bubble, and the schedule's own bubble (SimulatedBubble with equal forward,
// input- and weight-gradient costs).

// Prints the report to stdout; returns the command's exit status (0, or
// ReportRpcError's when replaying the job's steps failed).
int PrintStages(JobClient& client, const trainyard::v1::Job& job);

// One stage's phase times (seconds) and counters summed over steps.
struct StageTotals {
  double forward = 0, backward = 0, comm = 0, idle = 0, optimizer = 0, loss = 0;
  int64_t syncs = 0, copy_bytes = 0;
  int64_t steps = 0;
};

// Replays the job's history up to its newest completed step and sums each
// stage's timings; a watch error other than Cancelled is returned.
absl::StatusOr<std::map<int, StageTotals>> SumStageTimings(
    JobClient& client, const trainyard::v1::Job& job) {
  std::map<int, StageTotals> sums;
  const int64_t last = job.steps_completed();
  if (last <= 0) return sums;
  std::atomic<bool> stop{false};
  absl::StatusOr<trainyard::v1::JobStateChange> watched = client.Watch(
      job.job_id(), 1,
      [&](const trainyard::v1::JobEvent& e) {
        if (!e.has_step() || e.step().step() > last) return;
        for (const trainyard::v1::StageTiming& t : e.step().stages()) {
          StageTotals& s = sums[t.stage()];
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
    return watched.status();
  }
  return sums;
}

// The table of mean milliseconds per step, one row per stage, and the mean
// of the stages' bubbles.
void PrintStageTable(const std::map<int, StageTotals>& sums) {
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
}

// The bubble of the job's schedule with equal pass costs, when the schedule
// can be made.
void PrintScheduleBubble(const trainyard::v1::ParallelismSpec& par) {
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
}

int PrintStages(JobClient& client, const trainyard::v1::Job& job) {
  absl::StatusOr<std::map<int, StageTotals>> sums =
      SumStageTimings(client, job);
  if (!sums.ok()) {
    return ReportRpcError("get --stages", client, sums.status());
  }
  absl::StatusOr<JobPlan> plan = PlanJob(job.spec(), PlanOptions::ShapeOnly());
  const auto& par =
      plan.ok() ? plan->spec.parallelism() : job.spec().parallelism();
  std::cout << absl::StrFormat(
      "job %s: %d step(s); %d stage(s), schedule %s, %d microbatch(es)\n",
      job.job_id(), job.steps_completed(), par.stages(), par.schedule(),
      par.microbatches());
  PrintStageTable(*sums);
  PrintScheduleBubble(par);
  return 0;
}

// The client commands: submit, get, list, cancel, watch, workers, logs and
// trace, each a call (or a stream) to the controller at --controller
// (cli/connect.h). `args` is the command line left after the flags:
// args[1] is the command, args[2] the job id.
//
// Each returns the process's exit status: 0 success (watch and
// submit --watch: the job SUCCEEDED), 1 a failure while running or a job
// that ended FAILED or CANCELLED, 2 bad usage or a bad spec, 3 the
// controller could not be reached or refused the call, 4 a missing or
// refused token.

int Submit(const CliFlags& flags);
int Get(const CliFlags& flags, const std::vector<char*>& args);
int List(const CliFlags& flags);
int Cancel(const CliFlags& flags, const std::vector<char*>& args);
int Watch(const CliFlags& flags, const std::vector<char*>& args);
int Workers(const CliFlags& flags);
int Logs(const CliFlags& flags, const std::vector<char*>& args);
int Trace(const CliFlags& flags, const std::vector<char*>& args);

// Warns on stderr about stages whose spans were cut or that have not
// reported the step, then says what was written to `out`.
void PrintTraceSummary(const trainyard::v1::GetTraceResponse& trace,
                       const std::string& out) {
  int spans = 0;
  std::vector<std::string> missing;
  std::set<int> have;
  for (const auto& st : trace.stages()) {
    spans += st.spans_size();
    have.insert(st.stage());
    if (st.truncated()) {
      std::cerr << "trainyard trace: stage " << st.stage()
                << " did more than the span limit allows; its trace is cut\n";
    }
  }
  for (int k = 0; k < trace.num_stages(); ++k) {
    if (have.count(k) == 0) missing.push_back(absl::StrCat(k));
  }
  if (!missing.empty()) {
    std::cerr << "trainyard trace: stage(s) " << absl::StrJoin(missing, ", ")
              << " have not reported step " << trace.step() << " (yet)\n";
  }
  std::cerr << "trainyard trace: wrote " << out << ": step " << trace.step()
            << " of " << trace.job_id() << ", " << trace.stages_size()
            << " stage(s), " << spans << " spans (steps " << trace.oldest_step()
            << ".." << trace.newest_step()
            << " are held). Open it in chrome://tracing or "
               "https://ui.perfetto.dev; each stage is drawn from its own "
               "step start (no clock sync between machines).\n";
}

int Submit(const CliFlags& flags) {
  const std::string path = flags.spec;
  if (path.empty()) {
    std::cerr << "trainyard submit: --spec is required\n";
    return 2;
  }
  auto spec = ReadSpecForSubmit(path);
  if (!spec.ok()) {
    std::cerr << "trainyard submit: " << spec.status().message() << "\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("submit", flags);
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  std::string request_id = flags.request_id;
  if (request_id.empty()) request_id = NewRequestId();
  auto job = client.Submit(*spec, request_id, flags.priority);
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
  if (!flags.watch) return 0;
  return WatchToEnd(client, job->job_id(), 0, ReconnectWindow(flags));
}

int Get(const CliFlags& flags, const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: trainyard get JOB_ID [--stages]\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("get", flags);
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto job = client.Get(args[2]);
  if (!job.ok()) return ReportRpcError("get", client, job.status());
  if (flags.get_stages) return PrintStages(client, *job);
  std::cout << ToJson(*job);
  return 0;
}

int List(const CliFlags& flags) {
  std::vector<trainyard::v1::JobState> states;
  for (absl::string_view name :
       absl::StrSplit(flags.state, ',', absl::SkipEmpty())) {
    trainyard::v1::JobState s;
    if (!trainyard::v1::JobState_Parse(std::string(name), &s)) {
      std::cerr
          << "trainyard list: --state: unknown state \"" << name
          << "\" (QUEUED, RUNNING, RECOVERING, SUCCEEDED, FAILED, CANCELLED)\n";
      return 2;
    }
    states.push_back(s);
  }
  std::unique_ptr<JobClient> connected = Connect("list", flags);
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto resp = client.List(states, flags.page_size, flags.page_token);
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

int Cancel(const CliFlags& flags, const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: trainyard cancel JOB_ID [--reason TEXT]\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("cancel", flags);
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto job = client.Cancel(args[2], flags.reason);
  if (!job.ok()) return ReportRpcError("cancel", client, job.status());
  std::cout << job->job_id() << " " << JobStateName(job->state()) << "\n";
  return 0;
}

int Watch(const CliFlags& flags, const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: trainyard watch JOB_ID [--from_step N]\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("watch", flags);
  if (connected == nullptr) return 2;
  return WatchToEnd(*connected, args[2], flags.from_step,
                    ReconnectWindow(flags));
}

int Workers(const CliFlags& flags) {
  std::unique_ptr<JobClient> connected = Connect("workers", flags);
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

int Logs(const CliFlags& flags, const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: trainyard logs JOB_ID [--follow]\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("logs", flags);
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  int64_t expected = 0;  // the seq the next line should have
  absl::Status st = client.WatchLogs(
      args[2], flags.follow,
      [&](const trainyard::v1::LogLine& l) {
        if (l.seq() > expected) {
          std::cout << "(" << l.seq() - expected
                    << " line(s) no longer held by the controller)\n";
        }
        expected = l.seq() + 1;
        std::cout << FormatLogLine(l) << std::endl;
      },
      ReconnectWindow(flags));
  if (!st.ok()) return ReportRpcError("logs", client, st);
  return 0;
}

int Trace(const CliFlags& flags, const std::vector<char*>& args) {
  if (args.size() != 3) {
    std::cerr << "usage: trainyard trace JOB_ID [--step N] [--out FILE]\n";
    return 2;
  }
  const int64_t step = flags.step;
  if (step < 0) {
    std::cerr << "trainyard trace: --step must be >= 0 (0 = the newest), got "
              << step << "\n";
    return 2;
  }
  std::unique_ptr<JobClient> connected = Connect("trace", flags);
  if (connected == nullptr) return 2;
  JobClient& client = *connected;
  auto trace = client.GetTrace(args[2], step);
  if (!trace.ok()) return ReportRpcError("trace", client, trace.status());
  std::string out = flags.out;
  if (out.empty()) {
    out = absl::StrCat(trace->job_id(), "-step", trace->step(), ".trace.json");
  }
  absl::Status written = WriteFileAtomically(out, ChromeTraceJson(*trace));
  if (!written.ok()) {
    std::cerr << "trainyard trace: --out " << out << ": " << written.message()
              << "\n";
    return 1;
  }
  PrintTraceSummary(*trace, out);
  std::cout << out << "\n";
  return 0;
}

// `trainyard train --spec FILE`: runs the job in this process
// (RunLocalJob), printing a JSON line per step and eval to stdout (or
// --metrics_out) and progress to stderr. --device, --precision and --stages
// override the spec's.

// Exit status: 0 the job ran to its end (or --stop_after_step), 1 it
// failed, 2 bad flags or a spec that is not a valid job.
int Train(const CliFlags& flags);

// The device every stage runs on: --device (whose kind then becomes the
// spec's device), else the spec's device ("cuda" is cuda:0, "sim" sim:0).
absl::StatusOr<Device> ChooseDevice(const std::string& device_flag,
                                    trainyard::v1::JobSpec* spec) {
  if (!device_flag.empty()) {
    absl::StatusOr<Device> d = ParseDevice(device_flag);
    if (!d.ok()) return d.status();
    spec->set_device(d->KindName());
    return *d;
  }
  if (spec->device() == "cuda") return Device::Cuda(0);
  if (spec->device() == "sim") return Device::Sim(0);
  return Device::Cpu();
}

// --precision and --stages over the spec's (--stages splits the blocks
// evenly by parameter count: the spec's split is dropped).
void ApplyOverrides(const CliFlags& flags, trainyard::v1::JobSpec* spec) {
  if (!flags.precision.empty()) spec->set_precision(flags.precision);
  if (flags.stages != 0) {
    spec->mutable_parallelism()->set_stages(flags.stages);
    spec->mutable_parallelism()->clear_split();
  }
}

// The run's options: plugins, BLAS threads (--threads, else one per core),
// stop and timeout, and callbacks printing metric lines to `out` and
// progress to stderr.
LocalJobOptions MakeOptions(const CliFlags& flags, const Device& device,
                            std::ostream* out) {
  LocalJobOptions options;
  options.device = device;
  options.plugin_dir = flags.plugin_dir;
  if (options.plugin_dir.empty()) options.plugin_dir = DefaultPluginDir();
  options.threads = flags.threads;
  if (options.threads <= 0) {
    options.threads = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  }
  options.stop_after_step = flags.stop_after_step;
  options.timeout = absl::Seconds(std::max(1, flags.timeout_s));
  options.on_step = [out](const StepReport& r, double seconds) {
    *out << StepJson(r, seconds) << std::endl;
  };
  options.on_eval = [out](int64_t step, const EvalReport& r) {
    *out << EvalJson(step, r) << std::endl;
  };
  options.on_log = [](const std::string& line) {
    std::cerr << "trainyard train: " << line << "\n";
  };
  options.on_checkpoint = [](int64_t step, const std::string& dir) {
    std::cerr << "trainyard train: checkpoint step " << step << " saved in "
              << dir << "\n";
  };
  return options;
}

void PrintJobSummary(const JobPlan& plan, const Device& device) {
  std::cerr << "trainyard train: " << plan.spec.name() << ": "
            << plan.blocks.size() << " blocks, " << plan.num_stages()
            << " stage(s) x " << plan.spec.parallelism().replicas()
            << " replica(s), " << plan.spec.parallelism().microbatches()
            << " microbatch(es), " << plan.spec.steps() << " steps on "
            << device.ToString() << " in " << plan.spec.precision() << "; "
            << "memory estimate " << plan.memory.description << "; BLAS "
            << BlasDescription() << "\n";
}

int Train(const CliFlags& flags) {
  const std::string spec_path = flags.spec;
  if (spec_path.empty()) {
    std::cerr << "trainyard train: --spec is required\n";
    return 2;
  }
  absl::StatusOr<trainyard::v1::JobSpec> spec = LoadJobSpecFile(spec_path);
  if (!spec.ok()) {
    std::cerr << "trainyard train: " << spec.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<Device> device = ChooseDevice(flags.device, &*spec);
  if (!device.ok()) {
    std::cerr << "trainyard train: --device: " << device.status().message()
              << "\n";
    return 2;
  }
  ApplyOverrides(flags, &*spec);
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
  if (!flags.metrics_out.empty()) {
    file.open(flags.metrics_out, std::ios::out | std::ios::trunc);
    if (!file) {
      std::cerr << "trainyard train: --metrics_out " << flags.metrics_out
                << ": cannot open for writing\n";
      return 2;
    }
    out = &file;
  }

  const LocalJobOptions options = MakeOptions(flags, *device, out);
  SetBlasThreads(options.threads);
  PrintJobSummary(*plan, *device);
  absl::Status st = RunLocalJob(*plan, options);
  if (!st.ok()) {
    std::cerr << "trainyard train: job failed: " << st.message() << "\n";
    return 1;
  }
  return 0;
}

// `trainyard schedule`: a pipeline schedule as data, simulated. Prints its
// actions, text timeline, per-stage bubble and peak activations (and draws
// the timeline as SVG with --svg). Needs no controller, except to take the
// pass costs from a job's trace (--costs_from).

// Exit status: 0 printed, 1 the schedule is invalid, a trace has no passes
// to time or the SVG cannot be written, 2 bad flags (or, with --costs_from,
// ReportRpcError's status).
int ScheduleCommand(const CliFlags& flags);

// --costs "F,B,W": three finite times >= 0, not all 0; nullopt otherwise.
std::optional<PassCosts> ParseCosts(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ',');
  double v[3];
  bool ok = parts.size() == 3;
  for (size_t i = 0; ok && i < 3; ++i) {
    ok = absl::SimpleAtod(parts[i], &v[i]) && std::isfinite(v[i]) && v[i] >= 0;
  }
  if (!ok || v[0] + v[1] + v[2] <= 0) return std::nullopt;
  return PassCosts{v[0], v[1], v[2]};
}

// Whole-stage costs per microbatch (ms) from a step's spans: a stage with v
// chunks has v spans of each kind per microbatch, so each kind's time is
// divided by the microbatches it ran. nullopt when the step has no forward,
// input- or weight-gradient span.
std::optional<PassCosts> MeanPassCosts(
    const trainyard::v1::GetTraceResponse& trace) {
  double sum[3] = {0, 0, 0};
  int n[3] = {0, 0, 0};
  for (const auto& stage : trace.stages()) {
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
  if (n[0] == 0 || n[1] == 0 || n[2] == 0) return std::nullopt;
  return PassCosts{sum[0] / n[0], sum[1] / n[1], sum[2] / n[2]};
}

// --costs_from JOB: the costs of the job's newest traced step (GetTrace at
// --controller). Returns 0 and sets *costs, or prints why not and returns
// the exit status.
int CostsFromJob(const CliFlags& flags, PassCosts* costs) {
  const std::string& job_id = flags.costs_from;
  std::unique_ptr<JobClient> client = Connect("schedule", flags);
  if (client == nullptr) return 2;
  auto trace = client->GetTrace(job_id, 0);
  if (!trace.ok()) return ReportRpcError("schedule", *client, trace.status());
  std::optional<PassCosts> mean = MeanPassCosts(*trace);
  if (!mean.has_value()) {
    std::cerr << "trainyard schedule: --costs_from " << job_id << ": step "
              << trace->step()
              << " has no forward, input- and weight-gradient spans\n";
    return 1;
  }
  *costs = *mean;
  std::cout << absl::StrFormat(
      "costs from %s step %d (mean per microbatch over %d stage(s)): "
      "F %.3f ms, B %.3f ms, W %.3f ms\n",
      job_id, trace->step(), trace->stages_size(), costs->forward,
      costs->backward_input, costs->backward_weight);
  return 0;
}

// The schedule's shape, chunk layout and costs, then its actions and text
// timeline (`width` columns).
void PrintSchedule(const Schedule& sched, const ScheduleSimulation& sim,
                   const PassCosts& costs, int width) {
  const int S = sched.num_stages;
  const int v = sched.num_chunks;
  std::cout << absl::StrFormat(
      "schedule %s: %d stage(s), %d microbatch(es), %d chunk(s) per stage",
      sched.name, S, sched.num_microbatches, v);
  if (v > 1 && sched.layout == ChunkLayout::kV) {
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
            << sched.ToString() << "\ntimeline:\n"
            << RenderTextTimeline(sched, sim, width) << "\n";
}

// Per stage: busy and idle time, bubble and peak activations; then the
// step's makespan and bubble.
void PrintStageTable(const Schedule& sched, const ScheduleSimulation& sim) {
  std::cout << absl::StrFormat("%-6s %8s %8s %8s %16s\n", "stage", "busy",
                               "idle", "bubble", "peak_in_flight");
  for (int s = 0; s < sched.num_stages; ++s) {
    std::string peak = absl::StrFormat("%.4g", sim.peak_in_flight[s]);
    if (sched.num_chunks > 1) {
      absl::StrAppendFormat(&peak, " (%d chunks)",
                            sim.peak_chunk_activations[s]);
    }
    std::cout << absl::StrFormat(
        "%-6d %8g %8g %8.4f %16s\n", s, sim.busy[s], sim.idle[s],
        sim.makespan > 0 ? sim.idle[s] / sim.makespan : 0.0, peak);
  }
  std::cout << absl::StrFormat(
      "step %g; bubble %.4f of the step (idle / (idle + busy), mean over "
      "stages), %.4f of compute (idle / busy)\n"
      "peak_in_flight: microbatches whose activations a stage holds at once "
      "(forward to weight pass), in whole-stage microbatches\n",
      sim.makespan, sim.bubble, sim.bubble_of_compute);
}

// --svg: the timeline drawn as SVG; 1 when the file cannot be written.
int WriteSvg(const std::string& svg, const Schedule& sched,
             const ScheduleSimulation& sim) {
  std::ofstream f(svg, std::ios::binary | std::ios::trunc);
  f << RenderSvgTimeline(sched, sim);
  f.close();
  if (!f) {
    std::cerr << "trainyard schedule: --svg: cannot write " << svg << "\n";
    return 1;
  }
  std::cerr << "trainyard schedule: wrote " << svg << "\n";
  return 0;
}

int ScheduleCommand(const CliFlags& flags) {
  const int S = flags.stages;
  const int M = flags.microbatches;
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
  if (!flags.costs_from.empty()) {
    if (int rc = CostsFromJob(flags, &costs); rc != 0) return rc;
  } else if (std::optional<PassCosts> parsed = ParseCosts(flags.costs)) {
    costs = *parsed;
  } else {
    std::cerr << "trainyard schedule: --costs: expected F,B,W, three "
                 "finite times >= 0 (not all 0), got \""
              << flags.costs << "\"\n";
    return 2;
  }
  absl::StatusOr<Schedule> sched =
      MakeTrainingSchedule(flags.schedule, S, M, flags.chunks, costs);
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
  PrintSchedule(*sched, *sim, costs, flags.width);
  PrintStageTable(*sched, *sim);
  if (!flags.svg.empty()) return WriteSvg(flags.svg, *sched, *sim);
  return 0;
}

// `trainyard up`: a local cluster (LocalCluster: a controller and
// --workers workers as child processes, TLS and tokens on unless
// --insecure) that runs until Ctrl-C, or, with --run FILE, runs that one
// job to its end, prints its final eval and stops.

// Installs SIGINT and SIGTERM handlers that stop the cluster. Exit status:
// 0 stopped by a signal, or the --run job SUCCEEDED; 1 the cluster failed
// (or was interrupted during --run) or the job ended otherwise; 2 bad flags
// or a bad --run spec; ReportRpcError's status when a call to the
// controller failed.
int Up(const CliFlags& flags);

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
            << opts.data_dir << "\n";
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

int Up(const CliFlags& flags) {
  LocalClusterOptions opts;
  if (int rc = ClusterOptionsFromFlags(flags, &opts); rc != 0) return rc;
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

// The commands of whoever runs a cluster: certs (a cluster CA,
// certificates, a tokens file and an admin token), token (a token for a
// user) and health (a daemon's grpc.health.v1 check, e.g. for a probe).

// Exit status: 0 written, 1 writing failed, 2 no --out.
int Certs(const CliFlags& flags);
// Exit status: 0 made (and appended to --tokens_file), 1 appending failed,
// 2 bad flags.
int Token(const CliFlags& flags);
// Exit status: 0 SERVING, 1 not serving or the check failed, 2 bad flags.
int Health(const CliFlags& flags);

int Certs(const CliFlags& flags) {
  const std::string out = flags.out;
  if (out.empty()) {
    std::cerr << "usage: trainyard certs --out DIR [--hosts NAME,...]\n";
    return 2;
  }
  std::vector<std::string> hosts =
      absl::StrSplit(flags.hosts, ',', absl::SkipWhitespace());
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

int Token(const CliFlags& flags) {
  const std::string user = flags.user;
  const std::string role_name = flags.role;
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
  const std::string tokens_file = flags.tokens_file;
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

int Health(const CliFlags& flags) {
  const std::string address = flags.address;
  if (address.empty()) {
    std::cerr << "usage: trainyard health --address HOST:PORT [--service S] "
                 "[--tls_ca FILE | --insecure]\n";
    return 2;
  }
  absl::StatusOr<JobClientSecurity> security = SecurityFromFlags(flags);
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
  req.set_service(flags.service);
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

// The parsed flags' values; `get_stages` is main's (see TakeGetStages).
CliFlags ReadFlags(bool get_stages) {
  CliFlags flags;
  flags.spec = absl::GetFlag(FLAGS_spec);
  flags.metrics_out = absl::GetFlag(FLAGS_metrics_out);
  flags.plugin_dir = absl::GetFlag(FLAGS_plugin_dir);
  flags.threads = absl::GetFlag(FLAGS_threads);
  flags.device = absl::GetFlag(FLAGS_device);
  flags.precision = absl::GetFlag(FLAGS_precision);
  flags.stages = absl::GetFlag(FLAGS_stages);
  flags.microbatches = absl::GetFlag(FLAGS_microbatches);
  flags.schedule = absl::GetFlag(FLAGS_schedule);
  flags.chunks = absl::GetFlag(FLAGS_chunks);
  flags.costs = absl::GetFlag(FLAGS_costs);
  flags.svg = absl::GetFlag(FLAGS_svg);
  flags.costs_from = absl::GetFlag(FLAGS_costs_from);
  flags.width = absl::GetFlag(FLAGS_width);
  flags.stop_after_step = absl::GetFlag(FLAGS_stop_after_step);
  flags.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  flags.controller = absl::GetFlag(FLAGS_controller);
  flags.priority = absl::GetFlag(FLAGS_priority);
  flags.request_id = absl::GetFlag(FLAGS_request_id);
  flags.watch = absl::GetFlag(FLAGS_watch);
  flags.from_step = absl::GetFlag(FLAGS_from_step);
  flags.reconnect_s = absl::GetFlag(FLAGS_reconnect_s);
  flags.state = absl::GetFlag(FLAGS_state);
  flags.page_size = absl::GetFlag(FLAGS_page_size);
  flags.page_token = absl::GetFlag(FLAGS_page_token);
  flags.reason = absl::GetFlag(FLAGS_reason);
  flags.workers = absl::GetFlag(FLAGS_workers);
  flags.data_dir = absl::GetFlag(FLAGS_data_dir);
  flags.run = absl::GetFlag(FLAGS_run);
  flags.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  flags.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  flags.token_file = absl::GetFlag(FLAGS_token_file);
  flags.insecure = absl::GetFlag(FLAGS_insecure);
  flags.out = absl::GetFlag(FLAGS_out);
  flags.step = absl::GetFlag(FLAGS_step);
  flags.follow = absl::GetFlag(FLAGS_follow);
  flags.hosts = absl::GetFlag(FLAGS_hosts);
  flags.user = absl::GetFlag(FLAGS_user);
  flags.role = absl::GetFlag(FLAGS_role);
  flags.tokens_file = absl::GetFlag(FLAGS_tokens_file);
  flags.address = absl::GetFlag(FLAGS_address);
  flags.service = absl::GetFlag(FLAGS_service);
  flags.controller_bin = absl::GetFlag(FLAGS_controller_bin);
  flags.worker_bin = absl::GetFlag(FLAGS_worker_bin);
  flags.get_stages = get_stages;
  return flags;
}

// `get JOB --stages` is a bare switch; train's --stages takes a number. For
// `get`, removes every "--stages" from argv (shortening *argc) and says
// whether there was one.
bool TakeGetStages(int* argc, char** argv) {
  if (*argc <= 1 || std::string(argv[1]) != "get") return false;
  bool found = false;
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    if (std::string(argv[i]) == "--stages") {
      found = true;
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  return found;
}

int RunCommand(const std::string& command, const CliFlags& flags,
               const std::vector<char*>& args) {
  if (command == "train") return Train(flags);
  if (command == "submit") return Submit(flags);
  if (command == "get") return Get(flags, args);
  if (command == "list") return List(flags);
  if (command == "cancel") return Cancel(flags, args);
  if (command == "watch") return Watch(flags, args);
  if (command == "workers") return Workers(flags);
  if (command == "logs") return Logs(flags, args);
  if (command == "trace") return Trace(flags, args);
  if (command == "up") return Up(flags);
  if (command == "certs") return Certs(flags);
  if (command == "token") return Token(flags);
  if (command == "health") return Health(flags);
  if (command == "schedule") return ScheduleCommand(flags);
  std::cerr << "trainyard: unknown command \"" << command << "\"\n" << kUsage;
  return 2;
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(trainyard::kUsage);
  const bool get_stages = trainyard::TakeGetStages(&argc, argv);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::cerr << trainyard::kUsage;
    return 2;
  }
  return trainyard::RunCommand(args[1], trainyard::ReadFlags(get_stages), args);
}
