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

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/random.h"
#include "engine/stage.h"
#include "glog/logging.h"
#include "kernels/activation.h"
#include "kernels/blas.h"
#include "kernels/linear.h"
#include "kernels/parallel.h"
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

// The benchmark's stage: the model above, batch 256 in `microbatches`
// microbatches, the given optimizer, one warm-up step run.
std::unique_ptr<Stage> MakeStage(const char* optimizer, int microbatches,
                                 bool tree_accumulation = false) {
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
  return std::move(*stage);
}

void BM_TrainStep(benchmark::State& state, const char* optimizer,
                  int microbatches, bool tree_accumulation = false) {
  SetBlasThreads(static_cast<int>(state.range(0)));
  std::unique_ptr<Stage> stage =
      MakeStage(optimizer, microbatches, tree_accumulation);
  StageTimes total;
  for (auto _ : state) {
    auto report = stage->RunStep();
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

// Where a step's time goes, all measured in each iteration, side by side:
// the whole step (Stage::RunStep, AdamW, M microbatches of B/M rows), then
// the same step's GEMMs alone (the 6 per block and microbatch, with the
// step's shapes and accumulation, through Sgemm without epilogues), its
// element-wise passes alone (bias + GELU, fc2's bias, GELU's backward, the
// two bias gradients; threaded as the block threads them), and the
// ceiling: the full-batch SGEMM of the forward fc1 shape, 4 times. The
// optimizer's time is the step's own (norm, clip, update); "other" is the step
// less GEMMs, element-wise and optimizer: the loss, copies, the framework, and
// whatever the fused epilogues gain or lose against separate passes.
//   bazel run //engine:train_step_benchmark -- --benchmark_filter=Breakdown
void BM_StepBreakdown(benchmark::State& state, int microbatches) {
  // The ceiling GEMM runs this many times an iteration (~30 ms each on 2
  // threads), so that one slow call on a shared machine weighs less.
  constexpr int kCeilingRepeats = 4;
  SetBlasThreads(2);
  std::unique_ptr<Stage> stage = MakeStage("adamw", microbatches);
  const int64_t mb = kBatch / microbatches, h = kHidden, f = kFfn;
  Rng rng(2);
  const auto random = [&rng](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = rng.Uniform(-1, 1);
    return v;
  };
  // Per block: weights, their gradients, biases; per microbatch and block:
  // the saved activations and the gradients flowing back.
  std::vector<std::vector<float>> w1, w2, gw1, gw2, b1, b2, gb1, gb2;
  for (int i = 0; i < kBlocks; ++i) {
    w1.push_back(random(f * h));
    w2.push_back(random(h * f));
    gw1.push_back(std::vector<float>(f * h));
    gw2.push_back(std::vector<float>(h * f));
    b1.push_back(random(f));
    b2.push_back(random(h));
    gb1.push_back(std::vector<float>(f));
    gb2.push_back(std::vector<float>(h));
  }
  const int64_t n = int64_t{microbatches} * kBlocks;
  std::vector<std::vector<float>> x, pre, act, y, dy, dact, dx;
  for (int64_t i = 0; i < n; ++i) {
    x.push_back(random(mb * h));
    pre.push_back(random(mb * f));
    act.push_back(random(mb * f));
    y.push_back(std::vector<float>(mb * h));
    dy.push_back(random(mb * h));
    dact.push_back(random(mb * f));
    dx.push_back(std::vector<float>(mb * h));
  }
  std::vector<float> ca = random(kBatch * h), cb = random(f * h),
                     cc(kBatch * f);
  const auto seconds_of = [](const std::function<void()>& fn) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  };
  const auto rows = [](int64_t r, int64_t cols,
                       const std::function<void(int64_t, int64_t)>& fn) {
    ParallelRanges(r, std::max<int64_t>(1, (int64_t{1} << 16) / cols),
                   [&](int64_t begin, int64_t end) { fn(begin, end - begin); });
  };
  double step = 0, opt = 0, fwd = 0, dgrad = 0, wgrad = 0, elem = 0, ceil = 0;
  for (auto _ : state) {
    step += seconds_of([&] {
      auto report = stage->RunStep();
      CHECK_OK(report.status());
      opt += report->times.optimizer;
    });
    fwd += seconds_of([&] {
      for (int64_t i = 0; i < n; ++i) {
        const int blk = i % kBlocks;
        CHECK_OK(Sgemm(false, true, mb, f, h, 1.0f, x[i].data(), h,
                       w1[blk].data(), h, 0.0f, pre[i].data(), f));
        CHECK_OK(Sgemm(false, true, mb, h, f, 1.0f, act[i].data(), f,
                       w2[blk].data(), f, 0.0f, y[i].data(), h));
      }
    });
    dgrad += seconds_of([&] {
      for (int64_t i = 0; i < n; ++i) {
        const int blk = i % kBlocks;
        CHECK_OK(Sgemm(false, false, mb, f, h, 1.0f, dy[i].data(), h,
                       w2[blk].data(), f, 0.0f, dact[i].data(), f));
        // The first block's input gradient is not needed on a first stage.
        if (blk == 0) continue;
        CHECK_OK(Sgemm(false, false, mb, h, f, 1.0f, dact[i].data(), f,
                       w1[blk].data(), h, 0.0f, dx[i].data(), h));
      }
    });
    wgrad += seconds_of([&] {
      for (int64_t i = 0; i < n; ++i) {
        const int blk = i % kBlocks;
        const float beta = i < kBlocks ? 0.0f : 1.0f;
        CHECK_OK(Sgemm(true, false, h, f, mb, 1.0f, dy[i].data(), h,
                       act[i].data(), f, beta, gw2[blk].data(), f));
        CHECK_OK(Sgemm(true, false, f, h, mb, 1.0f, dact[i].data(), f,
                       x[i].data(), h, beta, gw1[blk].data(), h));
      }
    });
    elem += seconds_of([&] {
      for (int64_t i = 0; i < n; ++i) {
        const int blk = i % kBlocks;
        const bool accumulate = i >= kBlocks;
        rows(mb, f, [&](int64_t r, int64_t k) {
          BiasGeluForward(k, f, b1[blk].data(), pre[i].data() + r * f,
                          act[i].data() + r * f);
        });
        rows(mb, h, [&](int64_t r, int64_t k) {
          AddBiasResidual(k, h, b2[blk].data(), nullptr, y[i].data() + r * h);
        });
        rows(mb, f, [&](int64_t r, int64_t k) {
          GeluBackward(k * f, pre[i].data() + r * f, dact[i].data() + r * f);
        });
        ColumnSums(mb, h, dy[i].data(), accumulate, gb2[blk].data());
        ColumnSums(mb, f, dact[i].data(), accumulate, gb1[blk].data());
      }
    });
    ceil += seconds_of([&] {
      for (int rep = 0; rep < kCeilingRepeats; ++rep) {
        CHECK_OK(Sgemm(false, true, kBatch, f, h, 1.0f, ca.data(), h, cb.data(),
                       h, 0.0f, cc.data(), f));
      }
    });
  }
  const double it = static_cast<double>(state.iterations());
  const double gemms = fwd + dgrad + wgrad;
  // The first stage skips block 0's dx GEMM: 23 of the 24 GEMMs' flops.
  const double gemm_flops = kStepFlops * 23.0 / 24.0;
  const double ceiling = 2.0 * kBatch * h * f * kCeilingRepeats / (ceil / it);
  state.counters["step_ms"] = 1e3 * step / it;
  state.counters["gemm_fwd_ms"] = 1e3 * fwd / it;
  state.counters["gemm_dgrad_ms"] = 1e3 * dgrad / it;
  state.counters["gemm_wgrad_ms"] = 1e3 * wgrad / it;
  state.counters["elementwise_ms"] = 1e3 * elem / it;
  state.counters["optimizer_ms"] = 1e3 * opt / it;
  state.counters["other_ms"] = 1e3 * (step - gemms - elem - opt) / it;
  state.counters["ceiling_GFLOPs"] = 1e-9 * ceiling;
  state.counters["gemms_of_ceiling"] = gemm_flops / (gemms / it) / ceiling;
  state.counters["step_of_ceiling"] = gemm_flops / (step / it) / ceiling;
  state.counters["samples/s"] = kBatch / (step / it);
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
BENCHMARK_CAPTURE(BM_StepBreakdown, m1, 1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_StepBreakdown, m4, 4)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_StepBreakdown, m8, 8)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

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
