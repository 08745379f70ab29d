// StageOptimizer's CPU passes against the machine's memory bandwidth, in the
// same run: each iteration times one optimizer pass and, right after it, a
// memcpy that moves the same number of bytes (half read, half written), so
// both see the same load on a shared machine.
//
//   bazel run //engine:optimizer_benchmark -- --benchmark_repetitions=3
//
// Parameters: two blocks of h = 1024, ffn = 4096 with bias (16.8 M floats,
// one stage of the 4-block model split in two), far beyond the caches.
// Bytes a parameter: AdamW 28 (read p, g, m, v; write p, m, v), SGD with
// momentum 20 (read p, g, buf; write p, buf), the gradient sums of squares
// 4 (read g). Counters: GB/s of the pass, memcpy_GB/s of the interleaved
// copies, x_memcpy = the pass's time over the copies' (1.0: at the
// memcpy bound); same_traffic_GB/s and x_same_traffic likewise for a loop
// with the pass's own reads and writes and next to no arithmetic (AdamW:
// a += b, c *= k, d *= k), also interleaved.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/param_segment.h"
#include "core/random.h"
#include "engine/optimizer.h"
#include "glog/logging.h"
#include "kernels/parallel.h"

namespace trainyard {
namespace {

constexpr int64_t kHidden = 1024, kFfn = 4096, kBlocks = 2;

enum class Pass { kAdamW, kSgd, kSumsOfSquares };

std::vector<ParamSegment> Segments(int64_t* total) {
  std::vector<ParamSegment> out;
  *total = 0;
  auto add = [&](std::string name, Shape shape, bool decay) {
    ParamSegment s{std::move(name), std::move(shape), *total, decay};
    *total += s.size();
    out.push_back(std::move(s));
  };
  for (int b = 0; b < kBlocks; ++b) {
    const std::string p = "blocks." + std::to_string(b);
    add(p + ".fc1.weight", {kFfn, kHidden}, true);
    add(p + ".fc1.bias", {kFfn}, false);
    add(p + ".fc2.weight", {kHidden, kFfn}, true);
    add(p + ".fc2.bias", {kHidden}, false);
  }
  return out;
}

trainyard::v1::OptimizerSpec Spec(Pass pass) {
  trainyard::v1::OptimizerSpec s;
  s.set_lr(1e-4);
  s.set_weight_decay(0.01);
  if (pass == Pass::kSgd) {
    s.set_type("sgd");
    s.set_momentum(0.9);
  } else {
    s.set_type("adamw");
    s.set_beta1(0.9);
    s.set_beta2(0.999);
    s.set_eps(1e-8);
  }
  return s;
}

int64_t BytesPerParam(Pass pass) {
  switch (pass) {
    case Pass::kAdamW:
      return 28;
    case Pass::kSgd:
      return 20;
    case Pass::kSumsOfSquares:
      return 4;
  }
  return 0;
}

// Copies src to dst split into one contiguous piece per thread.
void ThreadedMemcpy(char* dst, const char* src, int64_t bytes, int threads) {
  ParallelFor(threads, [&](int t) {
    const int64_t begin = bytes * t / threads;
    const int64_t end = bytes * (t + 1) / threads;
    std::memcpy(dst + begin, src + begin, end - begin);
  });
}

// The passes' memory traffic with next to no arithmetic: AdamW's reads of
// four streams and writes of three, SGD's three and two, one read.
void AdamWTraffic(int64_t n, float* __restrict a, const float* __restrict b,
                  float* __restrict c, float* __restrict d) {
  for (int64_t i = 0; i < n; ++i) {
    a[i] += b[i];
    c[i] *= 0.5f;
    d[i] *= 0.5f;
  }
}

void SgdTraffic(int64_t n, float* __restrict a, const float* __restrict b,
                float* __restrict c) {
  for (int64_t i = 0; i < n; ++i) {
    a[i] += b[i];
    c[i] *= 0.5f;
  }
}

float ReadTraffic(int64_t n, const float* b) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += b[i + j];
  }
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] +
         lanes[6] + lanes[7];
}

// The pass's traffic over `bufs` (four [n] buffers), threaded in the
// optimizer's 65536-element pieces.
void SameTraffic(Pass pass, std::vector<std::vector<float>>* bufs) {
  float* a = (*bufs)[0].data();
  const float* b = (*bufs)[1].data();
  float* c = (*bufs)[2].data();
  float* d = (*bufs)[3].data();
  const int64_t n = static_cast<int64_t>((*bufs)[0].size());
  constexpr int64_t kPiece = int64_t{1} << 16;
  ParallelFor(static_cast<int>((n + kPiece - 1) / kPiece), [&](int t) {
    const int64_t begin = t * kPiece, len = std::min(n - begin, kPiece);
    switch (pass) {
      case Pass::kAdamW:
        AdamWTraffic(len, a + begin, b + begin, c + begin, d + begin);
        break;
      case Pass::kSgd:
        SgdTraffic(len, a + begin, b + begin, c + begin);
        break;
      case Pass::kSumsOfSquares:
        benchmark::DoNotOptimize(ReadTraffic(len, b + begin));
        break;
    }
  });
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

void BM_Optimizer(benchmark::State& state, Pass pass) {
  const int threads = static_cast<int>(state.range(0));
  SetComputeThreads(threads);
  int64_t n = 0;
  std::vector<ParamSegment> segments = Segments(&n);
  auto opt = StageOptimizer::Create(Spec(pass), segments, n);
  CHECK(opt.ok()) << opt.status();
  std::vector<float> params(n), grads(n);
  Rng rng(1);
  for (float& x : params) x = rng.Uniform(-1, 1);
  for (float& x : grads) x = rng.Uniform(-1e-3, 1e-3);
  // Pass bytes = copy bytes read + written; buffers touched up front.
  const int64_t bytes = BytesPerParam(pass) * n;
  std::vector<char> src(bytes / 2, 1), dst(bytes / 2, 2);
  opt->Step(params.data(), grads.data(), 1e-4, 1.0);  // first-step branches
  std::vector<std::vector<float>> same(4, std::vector<float>(n, 1.0f));
  double pass_s = 0, copy_s = 0, same_s = 0;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    if (pass == Pass::kSumsOfSquares) {
      benchmark::DoNotOptimize(opt->GradSumsOfSquares(grads.data()));
    } else {
      opt->Step(params.data(), grads.data(), 1e-4, 0.5);
    }
    const double s = Seconds(start);
    state.SetIterationTime(s);
    pass_s += s;
    start = std::chrono::steady_clock::now();
    ThreadedMemcpy(dst.data(), src.data(), bytes / 2, threads);
    benchmark::ClobberMemory();
    copy_s += Seconds(start);
    start = std::chrono::steady_clock::now();
    SameTraffic(pass, &same);
    benchmark::ClobberMemory();
    same_s += Seconds(start);
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["GB/s"] = bytes * iters / pass_s * 1e-9;
  state.counters["memcpy_GB/s"] = bytes * iters / copy_s * 1e-9;
  state.counters["x_memcpy"] = pass_s / copy_s;
  state.counters["same_traffic_GB/s"] = bytes * iters / same_s * 1e-9;
  state.counters["x_same_traffic"] = pass_s / same_s;
  state.counters["params"] = static_cast<double>(n);
}

BENCHMARK_CAPTURE(BM_Optimizer, adamw, Pass::kAdamW)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_Optimizer, sgd_momentum, Pass::kSgd)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_Optimizer, grad_sums_of_squares, Pass::kSumsOfSquares)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

}  // namespace
}  // namespace trainyard

BENCHMARK_MAIN();
