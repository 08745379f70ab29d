// trainyard: the command-line client.
//
//   trainyard train --spec job.json [--metrics_out FILE] [--plugin_dir DIR]
//                   [--threads N] [--stop_after_step N]
//
// `train` runs a whole job in this process (each pipeline stage a thread)
// and prints one JSON line per step (and per eval) to stdout or
// --metrics_out. Exit status: 0 on success, 2 for a bad spec or usage, 1 for
// a failure while running.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "core/job_plan.h"
#include "kernels/blas.h"
#include "worker/local_job.h"

ABSL_FLAG(std::string, spec, "", "Job spec file (proto3 JSON).");
ABSL_FLAG(std::string, metrics_out, "",
          "Write the JSON metric lines here instead of stdout.");
ABSL_FLAG(std::string, plugin_dir, "",
          "Folder holding lib<plugin>.so task plugins (default: the "
          "task_plugins folder next to this binary's folder).");
ABSL_FLAG(int, threads, 0, "BLAS threads (0 = one per core).");
ABSL_FLAG(int64_t, stop_after_step, 0,
          "Stop after this many completed steps, as if interrupted "
          "(checkpoints permitting, a rerun with resume \"latest\" "
          "continues).");

namespace trainyard {
namespace {

constexpr char kUsage[] =
    "trainyard <command> [flags]\n\n"
    "commands:\n"
    "  train --spec job.json   run a job in this process\n";

std::string Dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string DefaultPluginDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "task_plugins";
  buf[n] = '\0';
  return Dirname(Dirname(Dirname(buf))) + "/task_plugins";
}

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
  options.plugin_dir = absl::GetFlag(FLAGS_plugin_dir);
  if (options.plugin_dir.empty()) options.plugin_dir = DefaultPluginDir();
  options.threads = absl::GetFlag(FLAGS_threads);
  if (options.threads <= 0) {
    options.threads = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  }
  SetBlasThreads(options.threads);
  options.stop_after_step = absl::GetFlag(FLAGS_stop_after_step);
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
            << " stage(s), " << plan->spec.parallelism().microbatches()
            << " microbatch(es), " << plan->spec.steps() << " steps; "
            << "memory estimate " << plan->memory.description << "; BLAS "
            << BlasDescription() << "\n";
  absl::Status st = RunLocalJob(*plan, options);
  if (!st.ok()) {
    std::cerr << "trainyard train: job failed: " << st.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(trainyard::kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::cerr << trainyard::kUsage;
    return 2;
  }
  const std::string command = args[1];
  if (command == "train") return trainyard::Train();
  std::cerr << "trainyard: unknown command \"" << command << "\"\n"
            << trainyard::kUsage;
  return 2;
}
