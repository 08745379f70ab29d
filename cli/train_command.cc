#include "cli/train_command.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cli/cli_flags.h"
#include "core/device.h"
#include "core/file_util.h"
#include "engine/local_job.h"
#include "engine/task_loader.h"
#include "kernels/blas.h"
#include "kernels/packed_gemm.h"
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

// --precision, --stages, --checkpoint_dir and --output_dir over the spec's
// (--stages splits the blocks evenly by parameter count: the spec's split
// is dropped). The folders are as given: relative to the current folder.
void ApplyOverrides(const CliFlags& flags, trainyard::v1::JobSpec* spec) {
  if (!flags.precision.empty()) spec->set_precision(flags.precision);
  if (!flags.checkpoint_dir.empty()) {
    const std::string dir = CleanAbsolutePath(flags.checkpoint_dir);
    if (spec->kind().empty() || spec->kind() == "train") {
      spec->mutable_checkpoint()->set_dir(dir);
    } else {
      spec->mutable_inference()->set_checkpoint_dir(dir);
    }
  }
  if (!flags.output_dir.empty()) {
    spec->mutable_inference()->set_output_dir(
        CleanAbsolutePath(flags.output_dir));
  }
  if (flags.stages != 0) {
    spec->mutable_parallelism()->set_stages(flags.stages);
    spec->mutable_parallelism()->clear_split();
  }
}

struct ShardProgress {
  absl::Mutex mu;
  int64_t rows ABSL_GUARDED_BY(mu) = 0;
};

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
    std::cerr << "trainyard: " << line << "\n";
  };
  // Shards finish on the replicas' threads: one line at a time, and the
  // running total.
  auto shards = std::make_shared<ShardProgress>();
  options.on_shard = [out, shards](int64_t shard, int64_t rows,
                                   double seconds) {
    absl::MutexLock lock(&shards->mu);
    shards->rows += rows;
    *out << "{\"shard\":" << shard << ",\"rows\":" << rows
         << ",\"rows_done\":" << shards->rows << ",\"rows_per_sec\":"
         << absl::StrFormat("%.1f", seconds > 0 ? rows / seconds : 0.0) << "}"
         << std::endl;
  };
  options.on_checkpoint = [](int64_t step, const std::string& dir) {
    std::cerr << "trainyard train: checkpoint step " << step << " saved in "
              << dir << "\n";
  };
  return options;
}

void PrintJobSummary(const std::string& command, const JobPlan& plan,
                     const Device& device) {
  std::cerr << "trainyard " << command << ": " << plan.spec.name() << ": "
            << plan.blocks.size() << " blocks, " << plan.num_stages()
            << " stage(s) x " << plan.spec.parallelism().replicas()
            << " replica(s), " << plan.spec.parallelism().microbatches()
            << " microbatch(es), "
            << (plan.trains() ? absl::StrCat(plan.spec.steps(), " steps")
                              : "forward only")
            << " on " << device.ToString() << " in " << plan.spec.precision()
            << "; "
            << "memory estimate " << plan.memory.description << "; BLAS "
            << BlasDescription()
            << (device.is_cpu() ? absl::StrCat("; ", PackedGemmDescription())
                                : "")
            << "\n";
}

}  // namespace

int LocalJobCommand(const CliFlags& flags, const std::string& command) {
  const std::string me = "trainyard " + command;
  const std::string spec_path = flags.spec;
  if (spec_path.empty()) {
    std::cerr << me << ": --spec is required\n";
    return 2;
  }
  absl::StatusOr<trainyard::v1::JobSpec> spec = LoadJobSpecFile(spec_path);
  if (!spec.ok()) {
    std::cerr << me << ": " << spec.status().message() << "\n";
    return 2;
  }
  const std::string kind = spec->kind().empty() ? "train" : spec->kind();
  if (kind != command) {
    std::cerr << me << ": " << spec_path << " is a job of kind \"" << kind
              << "\"; run it with `trainyard " << kind
              << "` (or set \"kind\": \"" << command << "\")\n";
    return 2;
  }
  absl::StatusOr<Device> device = ChooseDevice(flags.device, &*spec);
  if (!device.ok()) {
    std::cerr << me << ": --device: " << device.status().message() << "\n";
    return 2;
  }
  ApplyOverrides(flags, &*spec);
  PlanOptions plan_options;
  plan_options.base_dir = Dirname(spec_path);
  absl::StatusOr<JobPlan> plan = PlanJob(*spec, plan_options);
  if (!plan.ok()) {
    std::cerr << me << ": " << spec_path << " is not a valid job:\n"
              << plan.status().message() << "\n";
    return 2;
  }

  std::ofstream file;
  std::ostream* out = &std::cout;
  if (!flags.metrics_out.empty()) {
    file.open(flags.metrics_out, std::ios::out | std::ios::trunc);
    if (!file) {
      std::cerr << me << ": --metrics_out " << flags.metrics_out
                << ": cannot open for writing\n";
      return 2;
    }
    out = &file;
  }

  const LocalJobOptions options = MakeOptions(flags, *device, out);
  SetBlasThreads(options.threads);
  PrintJobSummary(command, *plan, *device);
  absl::Status st = RunLocalJob(*plan, options);
  if (!st.ok()) {
    std::cerr << me << ": job failed: " << st.message() << "\n";
    return 1;
  }
  if (plan->kind == JobKind::kInfer) {
    std::cerr << me << ": outputs in " << plan->spec.inference().output_dir()
              << " (manifest.json)\n";
  }
  return 0;
}

int TrainCommand(const CliFlags& flags) {
  return LocalJobCommand(flags, "train");
}

}  // namespace trainyard
