// How fast a training job reads a sharded data set (npy_shards): the job's
// own path, LoadDataSource, then the batches of its BatchSampler taken from
// the first stage's read-ahead (engine/batch_reader.h), one after another
// with no compute between them, until --seconds pass or one epoch is read.
// Prints one JSON line (docs/BENCHMARKS.md, "Reading data at scale"):
//
//   bazel build //engine:data_read_benchmark
//   bazel-bin/engine/data_read_benchmark --batch 256 --seconds 60 --shuffle
//       --features '/var/tmp/trainyard-bench-data/features-*.npy'
//       --targets '/var/tmp/trainyard-bench-data/targets-*.npy'
//
// rows_per_s counts rows delivered (features widened to float32, as a stage
// gets them); gb_per_s is those rows at the files' stored width, features
// plus targets (1 GB = 1e9 bytes); peak_rss_mib is the process's VmHWM,
// rss_mib its VmRSS after the last batch. tools/bench_data.py runs this next
// to dd and PyTorch's DataLoader.
//
// With --train_steps N it measures instead how long a CPU training step
// waits for those rows: the first stage's data-wait phase
// (StageTimes::data_wait: taking the batch from the read-ahead) against the
// whole step, for the CPU benchmark model (train_step_benchmark's: 4
// blocks, h = 1024, ffn = 4096, GELU, bias; batch 256, AdamW, clip 1.0),
// its last block giving --classes logits for cross_entropy over class-id
// --targets. One JSON line: N steps timed after one warm-up step (which
// starts the reader and the allocations), mean step and data-wait
// milliseconds, the wait's share of the step, peak resident memory.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "core/host_info.h"
#include "core/status_macros.h"
#include "engine/batch_reader.h"
#include "engine/dataset.h"
#include "engine/stage.h"
#include "kernels/blas.h"
#include "plan/job_plan.h"
#include "proto/job_spec.pb.h"

ABSL_FLAG(std::string, features, "",
          "npy_shards.features: a path or glob of the features shards.");
ABSL_FLAG(std::string, targets, "",
          "npy_shards.targets: a path or glob of the targets shards.");
ABSL_FLAG(int64_t, batch, 256, "rows per batch (data.batch_size).");
ABSL_FLAG(double, seconds, 60, "stop after this long (or after one epoch).");
ABSL_FLAG(bool, shuffle, true, "data.shuffle: a seeded permutation per epoch.");
ABSL_FLAG(uint64_t, seed, 1, "data.seed: the shuffle's seed.");
ABSL_FLAG(int64_t, train_steps, 0,
          "> 0: train the CPU benchmark model for this many steps (after "
          "one) and report the data wait instead of reading.");
ABSL_FLAG(int64_t, classes, 1000,
          "--train_steps: the last block's outputs (> every class id).");
ABSL_FLAG(int, threads, 2, "--train_steps: BLAS threads.");
ABSL_FLAG(std::string, features_dtype, "",
          "npy_shards.features_dtype: \"\" (the headers' dtype) or "
          "\"bfloat16\".");

namespace trainyard {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The job's read path, a batch at a time: the rows the job's sampler picks
// next, gathered from the source as the first stage gathers them
// (Stage::BuildOnHost). The one place to change when the engine reads
// batches ahead on a thread of its own.
class JobBatches {
 public:
  // `data` (a sharded source) must outlive this.
  static absl::StatusOr<JobBatches> Create(const Dataset& data, int64_t batch,
                                           bool shuffle, uint64_t seed) {
    BatchReader::Options options;
    options.batch_size = batch;
    options.shuffle = shuffle;
    options.seed = seed;
    options.slice_begin = 0;
    options.slice_end = batch;
    options.depth = kReadAheadBatches;
    options.allocate = [](DType dtype, Shape shape) {
      return Tensor::Create(dtype, std::move(shape));
    };
    ASSIGN_OR_RETURN(std::unique_ptr<BatchReader> reader,
                     BatchReader::Create(data.shards, std::move(options)));
    return JobBatches(data, batch, shuffle, seed, std::move(reader));
  }

  // The next batch, as the first stage of a training job takes it: from
  // its read-ahead thread (features float32). Errors name the file.
  absl::StatusOr<BatchReader::Batch> Next() {
    const int64_t position = sampler_.position();
    sampler_.Next();
    return reader_->Take(position);
  }

 private:
  JobBatches(const Dataset& data, int64_t batch, bool shuffle, uint64_t seed,
             std::unique_ptr<BatchReader> reader)
      : sampler_(data.num_rows(), batch, shuffle, seed),
        reader_(std::move(reader)) {}

  BatchSampler sampler_;
  std::unique_ptr<BatchReader> reader_;
};

// Field `name` of /proc/self/status ("VmHWM", "VmRSS") in MiB.
absl::StatusOr<double> ProcessMemoryMib(absl::string_view name) {
  ASSIGN_OR_RETURN(const uint64_t bytes, ProcessStatusBytes(name));
  return static_cast<double>(bytes) / 1048576.0;
}

absl::Status CheckFlags() {
  if (absl::GetFlag(FLAGS_features).empty() ||
      absl::GetFlag(FLAGS_targets).empty()) {
    return absl::InvalidArgumentError(
        "--features and --targets must both name shard files (paths or "
        "globs)");
  }
  if (absl::GetFlag(FLAGS_batch) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch must be >= 1, got ", absl::GetFlag(FLAGS_batch)));
  }
  if (!(absl::GetFlag(FLAGS_seconds) > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--seconds must be > 0, got ", absl::GetFlag(FLAGS_seconds)));
  }
  return absl::OkStatus();
}

// What one run read.
struct Reading {
  int64_t rows = 0;
  int64_t batches = 0;
  double seconds = 0;
};

// Reads batches from `data` until --seconds pass or one epoch is read.
absl::StatusOr<Reading> ReadBatches(const Dataset& data) {
  ASSIGN_OR_RETURN(JobBatches batches,
                   JobBatches::Create(data, absl::GetFlag(FLAGS_batch),
                                      absl::GetFlag(FLAGS_shuffle),
                                      absl::GetFlag(FLAGS_seed)));
  const double limit = absl::GetFlag(FLAGS_seconds);
  Reading r;
  const Clock::time_point start = Clock::now();
  while (r.rows < data.num_rows() && r.seconds < limit) {
    ASSIGN_OR_RETURN(BatchReader::Batch batch, batches.Next());
    r.rows += batch.features.dim(0);
    ++r.batches;
    r.seconds = SecondsSince(start);
  }
  return r;
}

constexpr int64_t kHidden = 1024, kFfn = 4096, kBlocks = 4;

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
  spec.mutable_optimizer()->set_type("adamw");
  spec.mutable_optimizer()->set_lr(1e-4);
  spec.mutable_optimizer()->set_clip_grad(1.0);
  spec.mutable_task()->set_plugin("cross_entropy");
  auto* data = spec.mutable_data();
  auto* shards = data->mutable_train()->mutable_npy_shards();
  shards->add_features(absl::GetFlag(FLAGS_features));
  shards->add_targets(absl::GetFlag(FLAGS_targets));
  shards->set_features_dtype(absl::GetFlag(FLAGS_features_dtype));
  data->set_batch_size(absl::GetFlag(FLAGS_batch));
  data->set_shuffle(absl::GetFlag(FLAGS_shuffle));
  data->set_seed(absl::GetFlag(FLAGS_seed));
  return spec;
}

absl::Status Train() {
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
  const int64_t steps = absl::GetFlag(FLAGS_train_steps);
  for (int64_t i = 0; i < steps; ++i) {
    const Clock::time_point start = Clock::now();
    ASSIGN_OR_RETURN(const StepReport r, stage->RunStep());
    step += SecondsSince(start);
    wait += r.times.data_wait;
  }
  ASSIGN_OR_RETURN(const double peak_rss_mib, ProcessMemoryMib("VmHWM"));
  std::printf(
      "%s\n",
      absl::StrFormat("{\"bench\": \"data_wait\", \"rows\": %d, \"steps\": %d, "
                      "\"threads\": %d, \"first_step_wait_ms\": "
                      "%.2f, \"step_ms\": %.2f, \"data_wait_ms\": %.3f, "
                      "\"data_wait_share\": %.5f, \"samples_per_s\": %.1f, "
                      "\"peak_rss_mib\": %.1f}",
                      data.train->num_rows(), steps,
                      absl::GetFlag(FLAGS_threads), 1e3 * first.times.data_wait,
                      1e3 * step / steps, 1e3 * wait / steps, wait / step,
                      absl::GetFlag(FLAGS_batch) * steps / step, peak_rss_mib)
          .c_str());
  return absl::OkStatus();
}

absl::Status Run() {
  RETURN_IF_ERROR(CheckFlags());
  if (absl::GetFlag(FLAGS_train_steps) > 0) return Train();
  trainyard::v1::DataSource source;
  auto* shards = source.mutable_npy_shards();
  shards->add_features(absl::GetFlag(FLAGS_features));
  shards->add_targets(absl::GetFlag(FLAGS_targets));
  shards->set_features_dtype(absl::GetFlag(FLAGS_features_dtype));
  const Clock::time_point open_start = Clock::now();
  ASSIGN_OR_RETURN(Dataset data,
                   LoadDataSource(source, "", /*default_seed=*/1));
  const double open_s = SecondsSince(open_start);
  if (data.in_memory()) {
    return absl::InternalError(
        "LoadDataSource of npy_shards held it in memory");
  }
  ASSIGN_OR_RETURN(const Reading r, ReadBatches(data));
  ASSIGN_OR_RETURN(const double peak_rss_mib, ProcessMemoryMib("VmHWM"));
  ASSIGN_OR_RETURN(const double rss_mib, ProcessMemoryMib("VmRSS"));
  const uint64_t source_bytes = data.shards->bytes();
  const double row_bytes =
      static_cast<double>(source_bytes) / static_cast<double>(data.num_rows());
  const double rows = static_cast<double>(r.rows);
  std::printf(
      "%s\n",
      absl::StrFormat(
          "{\"bench\": \"data_read\", \"reader\": \"trainyard\", "
          "\"shards\": %d, \"source_rows\": %d, \"source_gb\": %.3f, "
          "\"row_bytes\": %.0f, \"batch\": %d, \"shuffle\": %s, "
          "\"open_s\": %.3f, \"rows\": %d, \"batches\": %d, "
          "\"seconds\": %.3f, \"rows_per_s\": %.1f, \"gb_per_s\": %.4f, "
          "\"peak_rss_mib\": %.1f, \"rss_mib\": %.1f}",
          data.shards->num_shards(), data.num_rows(), source_bytes * 1e-9,
          row_bytes, absl::GetFlag(FLAGS_batch),
          absl::GetFlag(FLAGS_shuffle) ? "true" : "false", open_s, r.rows,
          r.batches, r.seconds, rows / r.seconds,
          rows * row_bytes * 1e-9 / r.seconds, peak_rss_mib, rss_mib)
          .c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = trainyard::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "data_read_benchmark: %s\n",
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
