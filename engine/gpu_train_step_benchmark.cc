// Full training steps on one GPU, as `trainyard train --device cuda:0` runs
// them: forward, backward (input and weight gradients), the loss through the
// task plugin, the global norm, clipping and the fused AdamW update with
// float32 master weights. One JSON line per configuration:
//
//   bazel run //engine:gpu_train_step_benchmark            (on a GPU machine)
//   bin/gpu_train_step_benchmark                           (in the GPU bundle)
//
// Model: blocks of h = 8192, ffn = 32768, pre-LayerNorm, GELU
// (tanh), bias, residual; 8192 tokens per step; MSE on random data.
// Model FLOPs per step = 6 * 2 * T * h * ffn per block (the six GEMMs);
// MFU = that / step time / peak (989 TFLOP/s: H100 SXM dense bf16).
// Configurations, in one run:
//   mfu:      2 blocks, 1 stage, 1 microbatch (the MFU figure)
//   stages_1: 4 blocks, 1 stage, 4 microbatches  } samples/s side by side:
//   stages_4: 4 blocks, 4 stages (threads sharing } the pipeline's cost on
//             the GPU), 4 microbatches, 1f1b      } one GPU
// Each reports the median step time over --steps steps after --warmup
// (host wall time, as a user sees it), the last stage's phase times (device
// time, from CUDA events), its host<->device traffic per step (the step
// keeps everything on the device: the plugin's device loss, data resident
// and gathered there, one read of the step's scalars), and the loss
// head's share (mfu_without_loss_head: the figure with the loss phase taken
// out, for comparison with runs before the device loss).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "core/device.h"
#include "core/npy.h"
#include "core/random.h"
#include "engine/local_job.h"
#include "engine/task_loader.h"
#include "plan/job_plan.h"

ABSL_FLAG(int64_t, hidden, 8192, "h: block width.");
ABSL_FLAG(int64_t, ffn, 32768, "ffn hidden size.");
ABSL_FLAG(int64_t, tokens, 8192, "rows per step (the batch).");
ABSL_FLAG(std::string, precision, "bf16", "fp32, tf32 or bf16.");
ABSL_FLAG(std::string, device, "cuda:0",
          "where to run; \"cpu\" (with --precision fp32 and small sizes) "
          "checks the bookkeeping without a GPU.");
ABSL_FLAG(int, warmup, 3, "steps not timed.");
ABSL_FLAG(int, steps, 10, "timed steps.");
ABSL_FLAG(double, peak_tflops, 989.4, "the GPU's dense peak for MFU.");
ABSL_FLAG(std::string, plugin_dir, "",
          "where libmse.so is (default: next to this binary, as Bazel or "
          "the GPU bundle lays it out).");
ABSL_FLAG(std::string, only, "",
          "run one configuration: mfu, stages_1, "
          "stages_4");

namespace trainyard {
namespace {

std::string PluginDir() {
  if (!absl::GetFlag(FLAGS_plugin_dir).empty()) {
    return absl::GetFlag(FLAGS_plugin_dir);
  }
  return DefaultPluginDir();
}

// Random features and targets, written once.
absl::Status WriteData(const std::string& dir, int64_t rows, int64_t width) {
  Rng rng(1);
  for (const char* name : {"x.npy", "y.npy"}) {
    Tensor t = Tensor::Empty(DType::kFloat32, {rows, width});
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = rng.Uniform(-1, 1);
    absl::Status st = WriteNpy(dir + "/" + name, t);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

struct Config {
  const char* name;   // for --only
  const char* bench;  // the JSON line's "bench", as bench_gpu_mlp.py names it
  int blocks, stages, microbatches;
};

// The job: `c`'s model and pipeline on `device`, training on the data in
// `dir` for --warmup + --steps steps.
trainyard::v1::JobSpec MakeSpec(const Config& c, const std::string& dir,
                                const Device& device) {
  trainyard::v1::JobSpec spec;
  spec.set_name(c.name);
  spec.set_steps(absl::GetFlag(FLAGS_warmup) + absl::GetFlag(FLAGS_steps));
  spec.set_seed(1);
  spec.set_device(device.KindName());
  spec.set_precision(absl::GetFlag(FLAGS_precision));
  for (int b = 0; b < c.blocks; ++b) {
    auto* blk = spec.mutable_model()->add_blocks();
    blk->set_out_features(absl::GetFlag(FLAGS_hidden));
    blk->set_ffn_hidden_size(absl::GetFlag(FLAGS_ffn));
    blk->set_activation("gelu_tanh");
    blk->set_norm("layernorm");
    blk->set_residual(true);
  }
  spec.mutable_parallelism()->set_stages(c.stages);
  spec.mutable_parallelism()->set_microbatches(c.microbatches);
  spec.mutable_parallelism()->set_schedule("1f1b");
  spec.mutable_optimizer()->set_type("adamw");
  spec.mutable_optimizer()->set_lr(1e-5);
  spec.mutable_optimizer()->set_clip_grad(1.0);
  spec.mutable_task()->set_plugin("mse");
  auto* npy = spec.mutable_data()->mutable_train()->mutable_npy();
  npy->set_features(dir + "/x.npy");
  npy->set_targets(dir + "/y.npy");
  spec.mutable_data()->set_batch_size(absl::GetFlag(FLAGS_tokens));
  return spec;
}

// What the timed steps (those after --warmup) reported.
struct Measurements {
  std::vector<double> seconds;  // host wall time per step
  StageTimes times;             // summed over the steps
  DeviceTraffic traffic;        // summed over the steps
};

absl::Status Measure(const JobPlan& plan, const Device& device,
                     Measurements* m) {
  const int warmup = absl::GetFlag(FLAGS_warmup);
  LocalJobOptions options;
  options.device = device;
  options.plugin_dir = PluginDir();
  options.timeout = absl::Minutes(5);
  options.on_step = [&](const StepReport& r, double s) {
    if (r.step > warmup) {
      m->seconds.push_back(s);
      m->times.forward += r.times.forward;
      m->times.backward += r.times.backward;
      m->times.optimizer += r.times.optimizer;
      m->times.idle += r.times.idle;
      m->times.comm += r.times.comm;
      m->times.loss += r.times.loss;
      m->traffic.syncs += r.traffic.syncs;
      m->traffic.h2d_bytes += r.traffic.h2d_bytes;
      m->traffic.d2h_bytes += r.traffic.d2h_bytes;
    }
  };
  return RunLocalJob(plan, options);
}

// Prints `c`'s JSON line from `m`, which holds at least one step.
void Report(const Config& c, const Measurements& m) {
  const int64_t h = absl::GetFlag(FLAGS_hidden);
  const int64_t ffn = absl::GetFlag(FLAGS_ffn);
  const int64_t tokens = absl::GetFlag(FLAGS_tokens);
  const StageTimes& times = m.times;
  const DeviceTraffic& traffic = m.traffic;
  std::vector<double> sorted = m.seconds;
  std::sort(sorted.begin(), sorted.end());
  const double t = sorted[sorted.size() / 2];
  const double flops = 6.0 * 2.0 * tokens * h * ffn * c.blocks;
  const double n = static_cast<double>(m.seconds.size());
  std::printf(
      "{\"bench\":\"%s\",\"mode\":\"%s\",\"blocks\":%d,\"stages\":%d,"
      "\"microbatches\":%d,\"hidden\":%lld,\"ffn\":%lld,"
      "\"tokens\":%lld,\"step_ms\":%.3f,\"samples_per_sec\":%.1f,"
      "\"tflops\":%.1f,\"mfu\":%.4f,\"last_stage_forward_ms\":%.3f,"
      "\"last_stage_backward_ms\":%.3f,\"last_stage_optimizer_ms\":%.3f,"
      "\"last_stage_idle_ms\":%.3f,\"loss_head_ms\":%.3f,"
      "\"mfu_without_loss_head\":%.4f,\"last_stage_syncs_per_step\":%.2f,"
      "\"last_stage_copied_bytes_per_step\":%.0f}\n",
      c.bench, absl::GetFlag(FLAGS_precision).c_str(), c.blocks, c.stages,
      c.microbatches, static_cast<long long>(h), static_cast<long long>(ffn),
      static_cast<long long>(tokens), t * 1e3, tokens / t, flops / t * 1e-12,
      flops / t / (absl::GetFlag(FLAGS_peak_tflops) * 1e12),
      times.forward / n * 1e3, times.backward / n * 1e3,
      times.optimizer / n * 1e3, times.idle / n * 1e3, times.loss / n * 1e3,
      flops / (t - times.loss / n) / (absl::GetFlag(FLAGS_peak_tflops) * 1e12),
      traffic.syncs / n, (traffic.h2d_bytes + traffic.d2h_bytes) / n);
  std::fflush(stdout);
}

int Run(const Config& c, const std::string& dir) {
  absl::StatusOr<Device> device = ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    std::fprintf(stderr, "--device: %s\n",
                 std::string(device.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<JobPlan> plan =
      PlanJob(MakeSpec(c, dir, *device), PlanOptions());
  if (!plan.ok()) {
    std::fprintf(stderr, "%s: %s\n", c.name,
                 std::string(plan.status().message()).c_str());
    return 1;
  }
  Measurements m;
  absl::Status st = Measure(*plan, *device, &m);
  if (!st.ok() || m.seconds.empty()) {
    std::fprintf(stderr, "%s: %s\n", c.name, std::string(st.message()).c_str());
    return 1;
  }
  Report(c, m);
  return 0;
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  char tmpl[] = "/tmp/trainyard-gpu-bench-XXXXXX";
  const char* dir = mkdtemp(tmpl);
  if (dir == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  absl::Status st = trainyard::WriteData(dir, absl::GetFlag(FLAGS_tokens),
                                         absl::GetFlag(FLAGS_hidden));
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 1;
  }
  const trainyard::Config configs[] = {
      {"mfu", "train_step", 2, 1, 1},
      {"stages_1", "train_step_4blocks_1stage", 4, 1, 4},
      {"stages_4", "train_step_4blocks_4stages", 4, 4, 4}};
  int rc = 0;
  for (const auto& c : configs) {
    if (!absl::GetFlag(FLAGS_only).empty() &&
        absl::GetFlag(FLAGS_only) != c.name) {
      continue;
    }
    rc |= trainyard::Run(c, dir);
  }
  std::remove((std::string(dir) + "/x.npy").c_str());
  std::remove((std::string(dir) + "/y.npy").c_str());
  rmdir(dir);
  return rc;
}
