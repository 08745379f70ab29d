// One full training step of the engine (forward, backward-input,
// backward-weight, grad-norm, AdamW or SGD update) on one stage, next to a
// single sgemm of the step's GEMM shape as the ceiling, in the same run.
//
//   bazel run //engine:train_step_benchmark -- --benchmark_min_time=3
//
// Model: 4 blocks, h = 1024, ffn = 4096, GELU, bias, no norm; batch 256;
// task mse on synthetic regression data. GFLOP/s counts the 6 GEMMs per
// block (forward fc1, fc2; dgrad fc2, fc1; wgrad fc2, fc1), 2*B*h*ffn
// flops each: 51.5 GFLOP per step.
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/random.h"
#include "engine/stage.h"
#include "glog/logging.h"
#include "kernels/blas.h"
#include "plan/job_plan.h"

namespace trainyard {
namespace {

#define CHECK_OK(expr)               \
  do {                               \
    const absl::Status _st = (expr); \
    CHECK(_st.ok()) << _st;          \
  } while (0)

constexpr int64_t kHidden = 1024, kFfn = 4096, kBatch = 256, kBlocks = 4;
constexpr double kStepFlops = 6.0 * 2.0 * kBatch * kHidden * kFfn * kBlocks;

void BM_SgemmCeiling(benchmark::State& state) {
  SetBlasThreads(static_cast<int>(state.range(0)));
  // The forward fc1 shape: [B, h] x [h, ffn]^T.
  std::vector<float> a(kBatch * kHidden), b(kFfn * kHidden), c(kBatch * kFfn);
  Rng rng(1);
  for (float& x : a) x = rng.Uniform(-1, 1);
  for (float& x : b) x = rng.Uniform(-1, 1);
  for (auto _ : state) {
    CHECK_OK(Sgemm(false, true, kBatch, kFfn, kHidden, 1.0f, a.data(), kHidden,
                   b.data(), kHidden, 0.0f, c.data(), kFfn));
    benchmark::DoNotOptimize(c.data());
  }
  const double flops = 2.0 * kBatch * kHidden * kFfn;
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_TrainStep(benchmark::State& state, const char* optimizer,
                  int microbatches, bool tree_accumulation = true) {
  SetBlasThreads(static_cast<int>(state.range(0)));
  trainyard::v1::JobSpec spec;
  spec.set_name("bench");
  spec.set_steps(1000000);
  spec.set_seed(1);
  for (int i = 0; i < kBlocks; ++i) {
    auto* blk = spec.mutable_model()->add_blocks();
    blk->set_out_features(kHidden);
    blk->set_ffn_hidden_size(kFfn);
  }
  spec.mutable_parallelism()->set_microbatches(microbatches);
  spec.mutable_parallelism()->set_accumulation(
      tree_accumulation ? "tree" : "sequential");
  spec.mutable_optimizer()->set_type(optimizer);
  spec.mutable_optimizer()->set_lr(1e-4);
  spec.mutable_optimizer()->set_clip_grad(1.0);
  spec.mutable_task()->set_plugin("mse");
  auto* syn = spec.mutable_data()->mutable_train()->mutable_synthetic();
  syn->set_kind("teacher_regression");
  syn->set_num_samples(2 * kBatch);
  syn->set_num_features(kHidden);
  syn->set_num_outputs(kHidden);
  syn->set_noise(0.1);
  spec.mutable_data()->set_batch_size(kBatch);
  auto plan = PlanJob(spec, PlanOptions());
  CHECK_OK(plan.status());
  StageData data;
  auto train = LoadDataSource(plan->spec.data().train(), "", 1);
  CHECK_OK(train.status());
  data.train = std::make_shared<Dataset>(std::move(*train));
  StageOptions options;
  options.plugin_dir = DefaultPluginDir();
  auto stage = Stage::Create(*plan, 0, nullptr, options, data);
  CHECK_OK(stage.status());
  CHECK_OK((*stage)->InitParameters());
  CHECK_OK((*stage)->RunStep().status());  // warm up allocations
  StageTimes total;
  for (auto _ : state) {
    auto report = (*stage)->RunStep();
    CHECK_OK(report.status());
    total.forward += report->times.forward;
    total.backward += report->times.backward;
    total.optimizer += report->times.optimizer;
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["samples/s"] =
      benchmark::Counter(static_cast<double>(kBatch),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(
      kStepFlops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["fwd_ms"] = 1e3 * total.forward / iters;
  state.counters["bwd_ms"] = 1e3 * total.backward / iters;
  state.counters["opt_ms"] = 1e3 * total.optimizer / iters;
}

BENCHMARK(BM_SgemmCeiling)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, adamw, "adamw", 1)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, sgd, "sgd", 1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, adamw_4_microbatches, "adamw", 4)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The cost of summing weight gradients in engine/gradient_tree.h's fixed
// tree (parallelism.accumulation "tree") against one after another inside
// the GEMMs (the default), side by side (docs/BENCHMARKS.md, "Gradient
// accumulation order"):
//   bazel run //engine:train_step_benchmark --
//       --benchmark_filter=accumulation --benchmark_repetitions=3
//       --benchmark_enable_random_interleaving=true
BENCHMARK_CAPTURE(BM_TrainStep, accumulation_sequential_m4, "adamw", 4, false)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, accumulation_tree_m4, "adamw", 4, true)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, accumulation_sequential_m16, "adamw", 16, false)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, accumulation_tree_m16, "adamw", 16, true)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace trainyard

BENCHMARK_MAIN();
