// How long a CPU training step waits for its data when the data set is
// streamed from shards larger than the page cache: the first stage's
// data-wait phase (StageTimes::data_wait: taking the batch from the
// read-ahead, engine/batch_reader.h) against the whole step, for the CPU
// benchmark model (train_step_benchmark's: 4 blocks, h = 1024,
// ffn = 4096, GELU, bias; batch 256, AdamW, clip 1.0), its last block
// giving --classes logits for cross_entropy over class-id targets.
//
//   bazel build //engine:data_wait_benchmark
//   bazel-bin/engine/data_wait_benchmark --steps 40 --threads 2
//       --features '/var/tmp/trainyard-bench-data/features-*.npy'
//       --targets '/var/tmp/trainyard-bench-data/classes-*.npy'
//
// Prints one JSON line: steps timed (the first, which starts the reader and
// the allocations, is left out), mean step and data-wait milliseconds, the
// data wait's share of the step, and the process's peak resident memory.
#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "engine/stage.h"
#include "kernels/blas.h"
#include "plan/job_plan.h"

ABSL_FLAG(std::string, features, "", "npy_shards.features: path or glob.");
ABSL_FLAG(std::string, targets, "",
          "npy_shards.targets: path or glob of int64 class ids.");
ABSL_FLAG(std::string, features_dtype, "", "npy_shards.features_dtype.");
ABSL_FLAG(int64_t, classes, 1000, "the last block's outputs (> every id).");
ABSL_FLAG(int64_t, steps, 40, "steps timed (after one warm-up step).");
ABSL_FLAG(int, threads, 2, "BLAS threads.");
ABSL_FLAG(int, microbatches, 1, "parallelism.microbatches.");

namespace trainyard {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kHidden = 1024, kFfn = 4096, kBatch = 256, kBlocks = 4;

// The process's peak resident set (getrusage: VmHWM), MiB.
double PeakRssMib() {
  struct rusage usage = {};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;
}

trainyard::v1::JobSpec BenchmarkSpec() {
  trainyard::v1::JobSpec spec;
  spec.set_name("data-wait");
  spec.set_steps(1000000);
  spec.set_seed(1);
  for (int i = 0; i < kBlocks; ++i) {
    auto* blk = spec.mutable_model()->add_blocks();
    blk->set_out_features(i + 1 < kBlocks ? kHidden
                                          : absl::GetFlag(FLAGS_classes));
    blk->set_ffn_hidden_size(kFfn);
  }
  spec.mutable_parallelism()->set_microbatches(
      absl::GetFlag(FLAGS_microbatches));
  spec.mutable_optimizer()->set_type("adamw");
  spec.mutable_optimizer()->set_lr(1e-4);
  spec.mutable_optimizer()->set_clip_grad(1.0);
  spec.mutable_task()->set_plugin("cross_entropy");
  auto* data = spec.mutable_data();
  auto* shards = data->mutable_train()->mutable_npy_shards();
  shards->add_features(absl::GetFlag(FLAGS_features));
  shards->add_targets(absl::GetFlag(FLAGS_targets));
  shards->set_features_dtype(absl::GetFlag(FLAGS_features_dtype));
  data->set_batch_size(kBatch);
  data->set_shuffle(true);
  return spec;
}

absl::Status Run() {
  SetBlasThreads(absl::GetFlag(FLAGS_threads));
  ASSIGN_OR_RETURN(JobPlan plan, PlanJob(BenchmarkSpec(), PlanOptions()));
  StageData data;
  ASSIGN_OR_RETURN(Dataset train,
                   LoadDataSource(plan.spec.data().train(), "", 1));
  data.train = std::make_shared<Dataset>(std::move(train));
  StageOptions options;
  options.plugin_dir = DefaultPluginDir();
  ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage,
                   Stage::Create(plan, 0, nullptr, options, data));
  RETURN_IF_ERROR(stage->InitParameters());
  ASSIGN_OR_RETURN(const StepReport first, stage->RunStep());
  double wait = 0, step = 0;
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  for (int64_t i = 0; i < steps; ++i) {
    const Clock::time_point start = Clock::now();
    ASSIGN_OR_RETURN(const StepReport r, stage->RunStep());
    step += std::chrono::duration<double>(Clock::now() - start).count();
    wait += r.times.data_wait;
  }
  std::printf(
      "%s\n",
      absl::StrFormat(
          "{\"bench\": \"data_wait\", \"rows\": %d, \"steps\": %d, "
          "\"microbatches\": %d, \"threads\": %d, \"first_step_wait_ms\": "
          "%.2f, \"step_ms\": %.2f, \"data_wait_ms\": %.3f, "
          "\"data_wait_share\": %.5f, \"samples_per_s\": %.1f, "
          "\"peak_rss_mib\": %.1f}",
          data.train->num_rows(), steps, absl::GetFlag(FLAGS_microbatches),
          absl::GetFlag(FLAGS_threads), 1e3 * first.times.data_wait,
          1e3 * step / steps, 1e3 * wait / steps, wait / step,
          kBatch * steps / step, PeakRssMib())
          .c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = trainyard::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "data_wait_benchmark: %s\n",
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
