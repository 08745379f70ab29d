// trainyard: the command-line client. See kUsage below and the README's CLI
// reference. This file defines the flags (absl's --help lists the flags of
// the binary's main file), reads them into CliFlags and runs the command.
//
// Exit status: 0 success (for watch/submit --watch/up --run: the job
// SUCCEEDED), 1 a failure while running (or the job ended FAILED or
// CANCELLED), 2 bad usage or a bad spec, 3 the controller could not be
// reached or refused the call, 4 a missing or refused token.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "cli/admin_commands.h"
#include "cli/cli_flags.h"
#include "cli/client_commands.h"
#include "cli/data_command.h"
#include "cli/schedule_command.h"
#include "cli/train_command.h"
#include "cli/up_command.h"

ABSL_FLAG(std::string, spec, "", "Job spec file (proto3 JSON).");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "train: checkpoint.dir (checkpoints after the last step unless the "
          "spec says more often); infer, eval: inference.checkpoint_dir, the "
          "model's checkpoint folder (default: the spec's).");
ABSL_FLAG(std::string, output_dir, "",
          "infer: inference.output_dir, where the outputs are written "
          "(default: the spec's).");
ABSL_FLAG(std::string, job_data_dir, "",
          "up: the folder every job's files (data, weights, checkpoints, "
          "outputs) must stay inside, as on a deployed cluster: the "
          "workers' --data_dir and the controller's --job_data_dir "
          "(default: the folder of the --run spec, symlinks resolved, else "
          "the current folder).");
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
          "(default: JOB-step<N>.trace.json in the current folder). data "
          "convert: the new (or empty) shard folder.");
ABSL_FLAG(std::string, in, "",
          "data convert: comma-separated CSV files, or .npy features files "
          "(with --targets_in). data inspect: a shard folder or a glob of "
          "shard files.");
ABSL_FLAG(std::string, targets_in, "",
          "data convert: comma-separated .npy targets files, one per --in "
          "features file (int64 [n] class ids or float32 [n, K]).");
ABSL_FLAG(int64_t, shard_rows, 0, "data convert: rows per shard pair.");
ABSL_FLAG(std::string, target_columns, "",
          "data convert: the CSV's comma-separated target columns.");
ABSL_FLAG(std::string, feature_columns, "",
          "data convert: the CSV's comma-separated feature columns, in "
          "order (default: every other column).");
ABSL_FLAG(std::string, target_kind, "",
          "data convert: class (int64 class ids; default for one target "
          "column) or float (float32 [n, K]; default for several).");
ABSL_FLAG(std::string, features_dtype, "",
          "data convert: how features are stored: float32 (default), "
          "float16, or bfloat16 (as '<u2' words). data inspect: what the "
          "features files must hold (default float32 or float16, as each "
          "header says; bfloat16 reads '<u2' / '|V2' words).");
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
    "  infer --spec FILE [--checkpoint_dir DIR] [--output_dir DIR]\n"
    "                               run an inference job in this process "
    "(writes\n"
    "                               the task's outputs as .npy shards)\n"
    "  eval --spec FILE [--checkpoint_dir DIR]\n"
    "                               run an evaluation job in this process\n"
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
    "  up [--workers N] [--device D] [--run FILE] [--job_data_dir DIR] "
    "[--insecure]\n"
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

// The parsed flags' values; `get_stages` is main's (see TakeGetStages).
CliFlags ReadFlags(bool get_stages) {
  CliFlags flags;
  flags.spec = absl::GetFlag(FLAGS_spec);
  flags.metrics_out = absl::GetFlag(FLAGS_metrics_out);
  flags.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  flags.output_dir = absl::GetFlag(FLAGS_output_dir);
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
  flags.job_data_dir = absl::GetFlag(FLAGS_job_data_dir);
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

DataFlags ReadDataFlags() {
  DataFlags flags;
  flags.in = absl::GetFlag(FLAGS_in);
  flags.targets_in = absl::GetFlag(FLAGS_targets_in);
  flags.out = absl::GetFlag(FLAGS_out);
  flags.shard_rows = absl::GetFlag(FLAGS_shard_rows);
  flags.target_columns = absl::GetFlag(FLAGS_target_columns);
  flags.feature_columns = absl::GetFlag(FLAGS_feature_columns);
  flags.target_kind = absl::GetFlag(FLAGS_target_kind);
  flags.features_dtype = absl::GetFlag(FLAGS_features_dtype);
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
  if (command == "train" || command == "infer" || command == "eval") {
    return LocalJobCommand(flags, command);
  }
  if (command == "submit") return SubmitCommand(flags);
  if (command == "get") return GetCommand(flags, args);
  if (command == "list") return ListCommand(flags);
  if (command == "cancel") return CancelCommand(flags, args);
  if (command == "watch") return WatchCommand(flags, args);
  if (command == "workers") return WorkersCommand(flags);
  if (command == "logs") return LogsCommand(flags, args);
  if (command == "trace") return TraceCommand(flags, args);
  if (command == "up") return UpCommand(flags);
  if (command == "certs") return CertsCommand(flags);
  if (command == "token") return TokenCommand(flags);
  if (command == "health") return HealthCommand(flags);
  if (command == "schedule") return ScheduleCommand(flags);
  if (command == "data") return DataCommand(ReadDataFlags(), args);
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
