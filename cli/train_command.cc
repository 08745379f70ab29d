#include "cli/train_command.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/cli_flags.h"
#include "core/device.h"
#include "core/file_util.h"
#include "engine/local_job.h"
#include "engine/task_loader.h"
#include "kernels/blas.h"
#include "plan/job_plan.h"
#include "proto/job_spec.pb.h"

namespace trainyard {
namespace {

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

}  // namespace

int TrainCommand(const CliFlags& flags) {
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

}  // namespace trainyard
