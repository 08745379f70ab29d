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
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/allocator.h"
#include "core/random.h"
#include "core/tensor.h"
#include "engine/stage.h"
#include "glog/logging.h"
#include "kernels/activation.h"
#include "kernels/blas.h"
#include "kernels/linear.h"
#include "kernels/packed_gemm.h"
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

// n floats from the host allocator, as a stage's tensors are, so that the
// ceiling and the step's parts run on the same kind of pages as the step
// (core/allocator.h: huge pages for large blocks).
class Buffer {
 public:
  explicit Buffer(int64_t n) : t_(Tensor::Zeros(DType::kFloat32, {n})) {}
  float* data() { return t_.data<float>(); }
  int64_t size() const { return t_.numel(); }
  float* begin() { return data(); }
  float* end() { return data() + size(); }

 private:
  Tensor t_;
};

void BM_SgemmCeiling(benchmark::State& state) {
  SetBlasThreads(static_cast<int>(state.range(0)));
  // The forward fc1 shape: [B, h] x [h, ffn]^T.
  Buffer a(kBatch * kHidden), b(kFfn * kHidden), c(kBatch * kFfn);
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
                                 bool tree_accumulation) {
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

// tree_accumulation defaults to true here, as in every figure recorded
// with this benchmark's adamw, sgd and adamw_4_microbatches rows
// (docs/BENCHMARKS.md); BM_StepBreakdown uses the spec's default,
// sequential.
void BM_TrainStep(benchmark::State& state, const char* optimizer,
                  int microbatches, bool tree_accumulation = true) {
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
// step's shapes and accumulation, through Sgemm or, where the block uses it,
// the packed GEMM packing the weights in the first microbatch, without
// epilogues), its
// element-wise passes alone as separate passes (bias + GELU, fc2's bias,
// GELU's backward, the two bias gradients; threaded over rows, columns for
// the sums; the block itself runs the first three as GEMM epilogues on
// column tiles), and the
// ceiling: the full-batch SGEMM of the forward fc1 shape, 4 times. The
// optimizer's time is the step's own (norm, clip, update); "other" is the step
// less GEMMs, element-wise and optimizer: the loss, copies, the framework, and
// whatever the fused epilogues gain or lose against separate passes.
//   bazel run //engine:train_step_benchmark -- --benchmark_filter=Breakdown
// The step's parts on their own buffers: per block the weights, their
// gradients and biases; per microbatch and block the saved activations and
// the gradients flowing back (random values; only the time matters).
class StepParts {
 public:
  explicit StepParts(int microbatches)
      : mb_(kBatch / microbatches), n_(int64_t{microbatches} * kBlocks) {
    const int64_t h = kHidden, f = kFfn;
    // Weights as nn.Linear initialises them (U(+-1/sqrt(fan_in))), inputs
    // and gradients of unit variance: the pre-activations the GEMMs write
    // are O(1) as in training (wider ones would make GELU's backward meet
    // subnormal numbers, which real steps do not).
    const float unit = std::sqrt(3.0f);
    for (int i = 0; i < kBlocks; ++i) {
      w1_.push_back(Random(f * h, 1.0f / std::sqrt(float{h})));
      w2_.push_back(Random(h * f, 1.0f / std::sqrt(float{f})));
      gw1_.emplace_back(f * h);
      gw2_.emplace_back(h * f);
      b1_.push_back(Random(f, 1.0f / std::sqrt(float{h})));
      b2_.push_back(Random(h, 1.0f / std::sqrt(float{f})));
      gb1_.emplace_back(f);
      gb2_.emplace_back(h);
    }
    for (int64_t i = 0; i < n_; ++i) {
      x_.push_back(Random(mb_ * h, unit));
      pre_.push_back(Random(mb_ * f, unit));
      act_.push_back(Random(mb_ * f, unit));
      y_.emplace_back(mb_ * h);
      dy_.push_back(Random(mb_ * h, unit));
      dact_.push_back(Random(mb_ * f, unit));
      dx_.emplace_back(mb_ * h);
    }
    ca_ = Random(kBatch * h, unit);
    cb_ = Random(f * h, 1.0f / std::sqrt(float{h}));
    cc_ = Buffer(kBatch * f);
    // Allocates the packs (the stage's are warm too).
    ForwardGemms();
    InputGradientGemms();
  }

  // The forward and input-gradient GEMMs as the block runs them: with the
  // packed GEMM (kernels/packed_gemm.h, microbatches of at most
  // PackedGemmMaxRows() rows), the first microbatch's forward GEMMs pack
  // each weight (W^T) as they go and keep the packs, which every later GEMM
  // reads, the input gradients included; else OpenBLAS.
  // The packs of the previous iteration are dropped first, as a stage
  // drops them after the optimizer step.
  void ForwardGemms() {
    for (auto& p : packed_) p.Reset();
    const int64_t mb = mb_, h = kHidden, f = kFfn;
    for (int64_t i = 0; i < n_; ++i) {
      const int64_t blk = i % kBlocks;
      WeightGemm(true, mb, f, h, x_[i].data(), w1_[blk].data(),
                 &packed_[blk].fc1, pre_[i].data());
      WeightGemm(true, mb, h, f, act_[i].data(), w2_[blk].data(),
                 &packed_[blk].fc2, y_[i].data());
    }
  }
  // d(act) and dx (not block 0's: a first stage needs no input gradient).
  void InputGradientGemms() {
    const int64_t mb = mb_, h = kHidden, f = kFfn;
    for (int64_t i = 0; i < n_; ++i) {
      const int64_t blk = i % kBlocks;
      WeightGemm(false, mb, f, h, dy_[i].data(), w2_[blk].data(),
                 &packed_[blk].fc2, dact_[i].data());
      if (blk == 0) continue;
      WeightGemm(false, mb, h, f, dact_[i].data(), w1_[blk].data(),
                 &packed_[blk].fc1, dx_[i].data());
    }
  }
  // fc2.weight and fc1.weight, accumulated over the microbatches as the
  // one-stage step does: chained on the packed GEMM (the step runs its
  // weight passes at its end, plan/job_plan.h ChainsWeightPasses), else
  // one OpenBLAS GEMM a microbatch.
  void WeightGradientGemms() {
    const int64_t mb = mb_, h = kHidden, f = kFfn;
    if (UsePackedGemm(mb)) {
      for (int64_t blk = 0; blk < kBlocks; ++blk) {
        std::vector<GradientRows> fc2, fc1;
        for (int64_t i = blk; i < n_; i += kBlocks) {
          fc2.push_back({mb, dy_[i].data(), h, act_[i].data(), f});
          fc1.push_back({mb, dact_[i].data(), f, x_[i].data(), h});
        }
        CHECK_OK(SgemmWeightGradient(h, f, fc2, false, gw2_[blk].data(), f));
        CHECK_OK(SgemmWeightGradient(f, h, fc1, false, gw1_[blk].data(), h));
      }
      return;
    }
    for (int64_t i = 0; i < n_; ++i) {
      const int64_t blk = i % kBlocks;
      const float beta = i < kBlocks ? 0.0f : 1.0f;
      CHECK_OK(Sgemm(true, false, h, f, mb, 1.0f, dy_[i].data(), h,
                     act_[i].data(), f, beta, gw2_[blk].data(), f));
      CHECK_OK(Sgemm(true, false, f, h, mb, 1.0f, dact_[i].data(), f,
                     x_[i].data(), h, beta, gw1_[blk].data(), h));
    }
  }
  // Bias + GELU, fc2's bias, GELU's backward and the bias gradients, as
  // separate passes threaded over rows (columns for the sums).
  void Elementwise() {
    const int64_t mb = mb_, h = kHidden, f = kFfn;
    for (int64_t i = 0; i < n_; ++i) {
      const int64_t blk = i % kBlocks;
      ParallelRows(mb, f, [&](int64_t r, int64_t k) {
        BiasGeluForward(k, f, b1_[blk].data(), pre_[i].data() + r * f,
                        act_[i].data() + r * f);
      });
      ParallelRows(mb, h, [&](int64_t r, int64_t k) {
        AddBiasResidual(k, h, b2_[blk].data(), nullptr, y_[i].data() + r * h);
      });
      ParallelRows(mb, f, [&](int64_t r, int64_t k) {
        GeluBackward(k * f, pre_[i].data() + r * f, dact_[i].data() + r * f);
      });
      ColumnSums(mb, h, dy_[i].data(), i >= kBlocks, gb2_[blk].data());
      ColumnSums(mb, f, dact_[i].data(), i >= kBlocks, gb1_[blk].data());
    }
  }
  // The full-batch forward fc1 GEMM; returns its flops.
  double Ceiling() {
    CHECK_OK(Sgemm(false, true, kBatch, kFfn, kHidden, 1.0f, ca_.data(),
                   kHidden, cb_.data(), kHidden, 0.0f, cc_.data(), kFfn));
    return 2.0 * kBatch * kHidden * kFfn;
  }

 private:
  using Buffers = std::vector<Buffer>;

  // n values uniform in [-bound, bound].
  Buffer Random(int64_t n, float bound) {
    Buffer v(n);
    for (float& x : v) x = rng_.Uniform(-bound, bound);
    return v;
  }
  Rng rng_{2};
  const int64_t mb_, n_;
  Buffers w1_, w2_, gw1_, gw2_, b1_, b2_, gb1_, gb2_;
  Buffers x_, pre_, act_, y_, dy_, dact_, dx_;
  // The block's own weight GEMM, keeping the packs as a training stage
  // does (the input gradients read them).
  void WeightGemm(bool transposed, int64_t mb, int64_t n, int64_t k,
                  const float* x, const float* w, MlpBlockPacked::Weight* slot,
                  float* out) {
    CHECK_OK(MlpWeightGemm("weight", transposed, mb, n, k, x, w, slot, out));
  }

  Buffer ca_{0}, cb_{0}, cc_{0};
  MlpBlockPacked packed_[kBlocks];
};

double SecondsOf(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

void BM_StepBreakdown(benchmark::State& state, int microbatches) {
  // The ceiling GEMM runs this many times an iteration (~30 ms each on 2
  // threads), so that one slow call on a shared machine weighs less.
  constexpr int kCeilingRepeats = 4;
  SetBlasThreads(2);
  std::unique_ptr<Stage> stage =
      MakeStage("adamw", microbatches, /*tree_accumulation=*/false);
  StepParts parts(microbatches);
  // The first stage skips block 0's dx GEMM: 23 of the 24 GEMMs' flops.
  const double gemm_flops = kStepFlops * 23.0 / 24.0;
  double step = 0, opt = 0, fwd = 0, dgrad = 0, wgrad = 0, elem = 0;
  // Each iteration's ceiling (flops/s) and its step's and GEMMs' shares of
  // it: the shares are the medians of these, so that a stall in one
  // iteration (of the step, or of the ceiling, which once ran 30 times
  // slower and made a step look 32 times faster than the ceiling) moves
  // them no more than any other iteration does.
  std::vector<double> ceilings, step_shares, gemm_shares;
  for (auto _ : state) {
    const double step_s = SecondsOf([&] {
      auto report = stage->RunStep();
      CHECK_OK(report.status());
      opt += report->times.optimizer;
    });
    const double fwd_s = SecondsOf([&] { parts.ForwardGemms(); });
    const double dgrad_s = SecondsOf([&] { parts.InputGradientGemms(); });
    const double wgrad_s = SecondsOf([&] { parts.WeightGradientGemms(); });
    elem += SecondsOf([&] { parts.Elementwise(); });
    double ceiling_flops = 0;
    const double ceiling_s = SecondsOf([&] {
      for (int rep = 0; rep < kCeilingRepeats; ++rep) {
        ceiling_flops += parts.Ceiling();
      }
    });
    const double ceiling = ceiling_flops / ceiling_s;
    ceilings.push_back(ceiling);
    step_shares.push_back(gemm_flops / step_s / ceiling);
    gemm_shares.push_back(gemm_flops / (fwd_s + dgrad_s + wgrad_s) / ceiling);
    step += step_s;
    fwd += fwd_s;
    dgrad += dgrad_s;
    wgrad += wgrad_s;
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  const double it = static_cast<double>(state.iterations());
  // The times are means over the iterations (so that the parts add up to
  // the step); the ceiling and the shares are medians (above).
  state.counters["step_ms"] = 1e3 * step / it;
  state.counters["gemm_fwd_ms"] = 1e3 * fwd / it;
  state.counters["gemm_dgrad_ms"] = 1e3 * dgrad / it;
  state.counters["gemm_wgrad_ms"] = 1e3 * wgrad / it;
  state.counters["elementwise_ms"] = 1e3 * elem / it;
  state.counters["optimizer_ms"] = 1e3 * opt / it;
  state.counters["other_ms"] =
      1e3 * (step - fwd - dgrad - wgrad - elem - opt) / it;
  state.counters["packed_gemm"] = PackedGemmEnabled() ? 1 : 0;
  state.counters["ceiling_GFLOPs"] = 1e-9 * median(ceilings);
  state.counters["gemms_of_ceiling"] = median(gemm_shares);
  state.counters["step_of_ceiling"] = median(step_shares);
  state.counters["samples/s"] = kBatch / (step / it);
}

// Huge pages or not, side by side in one process: two stages of the same
// job, the first made (parameters, gradients, optimizer state, the packed
// GEMM's weight panels, and its warm-up step's activations) with
// core/allocator.h's huge pages off, the second with them on; their steps
// alternate, the order swapped every iteration. Activations are shared
// through the host allocator's cache, so from the second step on both
// stages draw theirs from the same blocks: only blocks of 2 MiB or more
// get huge pages, and at M = 4 and 8 no activation is that large (at
// M = 1 some are, so there the comparison covers the stage's own memory
// only). Reports each stage's mean step and the median of the per-iteration
// ratios huge / small pages.
//   bazel run //engine:train_step_benchmark --
//       --benchmark_filter=HugePages --benchmark_min_time=20
void BM_HugePages(benchmark::State& state, int microbatches) {
  SetBlasThreads(2);
  SetHostHugePagesForTesting(false);
  HostAllocator()->EmptyCache();
  std::unique_ptr<Stage> small =
      MakeStage("adamw", microbatches, /*tree_accumulation=*/false);
  SetHostHugePagesForTesting(true);
  HostAllocator()->EmptyCache();
  std::unique_ptr<Stage> huge =
      MakeStage("adamw", microbatches, /*tree_accumulation=*/false);
  double total[2] = {0, 0};
  std::vector<double> ratios;
  int iteration = 0;
  for (auto _ : state) {
    double seconds[2] = {0, 0};
    for (int turn = 0; turn < 2; ++turn) {
      const int which = (iteration + turn) % 2;
      seconds[which] = SecondsOf(
          [&] { CHECK_OK((which == 0 ? small : huge)->RunStep().status()); });
      total[which] += seconds[which];
    }
    ratios.push_back(seconds[1] / seconds[0]);
    ++iteration;
  }
  std::sort(ratios.begin(), ratios.end());
  const double it = static_cast<double>(state.iterations());
  state.counters["small_pages_ms"] = 1e3 * total[0] / it;
  state.counters["huge_pages_ms"] = 1e3 * total[1] / it;
  state.counters["huge_over_small"] = ratios[ratios.size() / 2];
  state.counters["ratio_min"] = ratios.front();
  state.counters["ratio_max"] = ratios.back();
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

// The step by parts (tools/bench_cpu_step.py runs these next to PyTorch).
BENCHMARK_CAPTURE(BM_StepBreakdown, m1, 1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_StepBreakdown, m2, 2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_StepBreakdown, m4, 4)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_StepBreakdown, m8, 8)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_CAPTURE(BM_HugePages, m1, 1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_HugePages, m4, 4)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_HugePages, m8, 8)
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
