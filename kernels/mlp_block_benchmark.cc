// Benchmarks of the CPU MLP block against the SGEMM ceiling.
//
//   bazel run -c opt //kernels:mlp_block_benchmark -- --benchmark_min_time=2
//   ... -- --blas_threads=1   (default 2)
//   ... -- --benchmark_repetitions=5 (median rows; use on a shared host)
//
// BM_Sgemm: one fc1-shaped SGEMM, M=256 (batch), N=4096, K=1024: the rate
// the whole step can at best reach. BM_MlpForwardBackward: a training step's
// compute for 4 blocks (h=1024, ffn=4096, gelu, bias, batch 256): Forward,
// BackwardInput and BackwardWeight (accumulating) of every block. Its
// GFLOP/s counts the 6 GEMMs of 2*b*h*ffn flops per block; the rest of the
// work (bias, activation, bias gradients) is the overhead being measured.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/random.h"
#include "core/tensor.h"
#include "glog/logging.h"
#include "kernels/blas.h"
#include "kernels/mlp_block.h"

namespace trainyard {
namespace {

Tensor RandomTensor(Rng* rng, Shape shape, float scale) {
  Tensor t = Tensor::Empty(DType::kFloat32, std::move(shape));
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = rng->Uniform(-scale, scale);
  return t;
}

void BM_Sgemm(benchmark::State& state) {
  const int64_t m = 256, n = 4096, k = 1024;
  Rng rng(1);
  const Tensor a = RandomTensor(&rng, {m, k}, 1.0f);
  const Tensor b = RandomTensor(&rng, {n, k}, 1.0f);
  Tensor c = Tensor::Empty(DType::kFloat32, {m, n});
  for (auto _ : state) {
    CHECK(Sgemm(false, true, m, n, k, 1.0f, a.data<float>(), k, b.data<float>(),
                k, 0.0f, c.data<float>(), n)
              .ok());
    benchmark::DoNotOptimize(c.data<float>());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(
      2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate,
      benchmark::Counter::OneK::kIs1000);
}
BENCHMARK(BM_Sgemm)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MlpForwardBackward(benchmark::State& state) {
  const int64_t batch = 256, h = 1024, ffn = 4096;
  const int kBlocks = 4;
  MlpBlockConfig config;
  config.in_features = config.out_features = h;
  config.ffn_hidden_size = ffn;
  config.activation = Activation::kGelu;
  config.bias = true;
  const MlpBlock block(config);
  Rng rng(2);
  std::vector<MlpBlockParams> params(kBlocks), grads(kBlocks);
  for (int i = 0; i < kBlocks; ++i) {
    std::vector<Tensor*> p = params[i].InOrder(config);
    std::vector<Tensor*> g = grads[i].InOrder(config);
    const std::vector<ParamInfo> infos = BlockParamInfos(config);
    for (size_t j = 0; j < infos.size(); ++j) {
      const float scale =
          1.0f / std::sqrt(static_cast<float>(infos[j].shape.back()));
      *p[j] = RandomTensor(&rng, infos[j].shape, scale);
      *g[j] = Tensor::Zeros(DType::kFloat32, infos[j].shape);
    }
  }
  const Tensor x = RandomTensor(&rng, {batch, h}, 1.0f);
  const Tensor d_loss = RandomTensor(&rng, {batch, h}, 1.0f);
  std::vector<MlpBlockSaved> saved(kBlocks);
  for (auto _ : state) {
    Tensor act = x;
    for (int i = 0; i < kBlocks; ++i) {
      Tensor y;
      CHECK(block.Forward(params[i], act, &y, &saved[i]).ok());
      act = y;
    }
    Tensor grad = d_loss;
    for (int i = kBlocks - 1; i >= 0; --i) {
      Tensor dx;
      // dx for block 0 too, so that all 6 GEMMs per block run.
      CHECK(block.BackwardInput(params[i], grad, &saved[i], &dx).ok());
      grad = dx;
    }
    for (int i = 0; i < kBlocks; ++i) {
      CHECK(
          block.BackwardWeight(&saved[i], /*accumulate=*/true, &grads[i]).ok());
    }
    benchmark::DoNotOptimize(grad.data<float>());
  }
  state.counters["samples/s"] =
      benchmark::Counter(batch, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOP/s"] =
      benchmark::Counter(kBlocks * 6 * 2.0 * batch * h * ffn,
                         benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::OneK::kIs1000);
}
BENCHMARK(BM_MlpForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    const char kFlag[] = "--blas_threads=";
    if (std::strncmp(argv[i], kFlag, sizeof(kFlag) - 1) == 0) {
      threads = std::atoi(argv[i] + sizeof(kFlag) - 1);
    } else {
      std::fprintf(stderr,
                   "unknown flag %s (besides --benchmark_*: "
                   "--blas_threads=N)\n",
                   argv[i]);
      return 2;
    }
  }
  trainyard::SetBlasThreads(threads);
  benchmark::AddCustomContext("blas", trainyard::BlasDescription());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
