// MLP block forward+backward throughput on one GPU, bf16 and tf32, with the
// cuBLASLt epilogues and with the element-wise path, against a plain
// cuBLASLt GEMM of the same shape (the ceiling). Prints one JSON line per
// measurement. Usage: mlp_benchmark [--hidden=8192 --tokens=8192
// --iters=10]. Exits 1 (with the reason) without a device.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "core/random.h"
#include "kernels/cuda/cuda_mlp_block.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/runtime.h"

namespace trainyard {
namespace gpu {
namespace {

#define BENCH_CHECK(expr)                                             \
  do {                                                                \
    absl::Status _s = (expr);                                         \
    if (!_s.ok()) {                                                   \
      std::fprintf(stderr, "%s: %s\n", #expr, _s.ToString().c_str()); \
      std::exit(1);                                                   \
    }                                                                 \
  } while (0)

DeviceBuffer RandomDevice(int64_t n, DType t, uint64_t seed) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(0, n * 4);
  BENCH_CHECK(b.status());
  std::vector<float> h(n);
  Rng rng(seed);
  for (float& x : h) x = rng.Uniform(-0.02f, 0.02f);
  BENCH_CHECK(b->CopyFromHost(h.data(), n * 4));
  if (t == DType::kFloat32) return std::move(*b);
  absl::StatusOr<DeviceBuffer> h16 = DeviceBuffer::Allocate(0, n * 2);
  BENCH_CHECK(h16.status());
  BENCH_CHECK(CastFloatToBf16(n, b->as<float>(), h16->data(), nullptr));
  BENCH_CHECK(StreamSynchronize(nullptr));
  return std::move(*h16);
}

void RunMlp(ComputeMode mode, const char* name, bool epilogues, int64_t h,
            int64_t tokens, int iters) {
  MlpBlockConfig c;
  c.in_features = c.out_features = h;
  c.ffn_hidden_size = 4 * h;
  c.activation = Activation::kGeluTanh;
  c.bias = true;
  auto block = CudaMlpBlock::Create(c, mode, 0);
  BENCH_CHECK(block.status());
  (*block)->set_use_epilogues(epilogues);
  const DType at =
      mode == ComputeMode::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
  DeviceBuffer w1 = RandomDevice(4 * h * h, DType::kFloat32, 1);
  DeviceBuffer w2 = RandomDevice(4 * h * h, DType::kFloat32, 2);
  DeviceBuffer b1 = RandomDevice(4 * h, DType::kFloat32, 3);
  DeviceBuffer b2 = RandomDevice(h, DType::kFloat32, 4);
  DeviceBuffer g1 = RandomDevice(4 * h * h, DType::kFloat32, 5);
  DeviceBuffer g2 = RandomDevice(4 * h * h, DType::kFloat32, 6);
  DeviceBuffer gb1 = RandomDevice(4 * h, DType::kFloat32, 7);
  DeviceBuffer gb2 = RandomDevice(h, DType::kFloat32, 8);
  DeviceBuffer x = RandomDevice(tokens * h, at, 9);
  DeviceBuffer dy = RandomDevice(tokens * h, at, 10);
  DeviceBuffer y = RandomDevice(tokens * h, at, 11);
  DeviceBuffer dx = RandomDevice(tokens * h, at, 12);
  CudaMlpBlockParams p;
  p.fc1_weight = w1.as<float>();
  p.fc2_weight = w2.as<float>();
  p.fc1_bias = b1.as<float>();
  p.fc2_bias = b2.as<float>();
  CudaMlpBlockGrads g{nullptr,         nullptr,        g1.as<float>(),
                      gb1.as<float>(), g2.as<float>(), gb2.as<float>()};
  auto step = [&] {
    CudaMlpBlockSaved s;
    BENCH_CHECK((*block)->Forward(p, tokens, x.data(), y.data(), &s, nullptr));
    BENCH_CHECK((*block)->BackwardInput(p, dy.data(), &s, dx.data(), nullptr));
    BENCH_CHECK((*block)->BackwardWeight(&s, true, g, nullptr));
  };
  step();
  BENCH_CHECK(StreamSynchronize(nullptr));
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < iters; ++i) step();
  BENCH_CHECK(StreamSynchronize(nullptr));
  const double sec = absl::ToDoubleSeconds(absl::Now() - t0) / iters;
  const double flops = 6.0 * 2.0 * tokens * h * (4.0 * h);
  DeviceAllocator* a = *DeviceAllocator::ForDevice(0);
  std::printf(
      "{\"bench\":\"mlp_fwd_bwd\",\"compute\":\"%s\",\"epilogues\":%s,"
      "\"fused_gemms_per_step\":%lld,\"hidden\":%lld,\"ffn\":%lld,"
      "\"tokens\":%lld,\"ms\":%.3f,\"tflops\":%.1f,"
      "\"device_mallocs\":%lld}\n",
      name, epilogues ? "true" : "false",
      (long long)((*block)->epilogue_stats().fused_gemms / (iters + 1)),
      (long long)h, (long long)(4 * h), (long long)tokens, sec * 1e3,
      flops / sec / 1e12, (long long)a->stats().device_mallocs);
  std::fprintf(stderr, "%s, epilogues %s:\n%s", name, epilogues ? "on" : "off",
               (*block)->EpilogueReport().c_str());
}

void RunGemm(GemmPrecision prec, const char* name, int64_t h, int64_t tokens,
             int iters) {
  auto gemm = GemmLt::Create(0);
  BENCH_CHECK(gemm.status());
  const int64_t m = tokens, n = 4 * h, k = h;
  DeviceBuffer a = RandomDevice(m * k, DType::kFloat32, 21);
  DeviceBuffer b = RandomDevice(n * k, DType::kFloat32, 22);
  DeviceBuffer d = RandomDevice(m * n, DType::kFloat32, 23);
  GemmArgs g;
  g.trans_b = true;
  g.m = m;
  g.n = n;
  g.k = k;
  g.precision = prec;
  g.a = a.data();
  g.lda = k;
  g.b = b.data();
  g.ldb = k;
  g.d = d.data();
  g.ldd = n;
  g.d_type =
      prec == GemmPrecision::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
  BENCH_CHECK((*gemm)->Run(g, nullptr));
  BENCH_CHECK(StreamSynchronize(nullptr));
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < iters; ++i) BENCH_CHECK((*gemm)->Run(g, nullptr));
  BENCH_CHECK(StreamSynchronize(nullptr));
  const double sec = absl::ToDoubleSeconds(absl::Now() - t0) / iters;
  std::printf(
      "{\"bench\":\"gemm\",\"precision\":\"%s\",\"m\":%lld,\"n\":%lld,"
      "\"k\":%lld,\"ms\":%.3f,\"tflops\":%.1f}\n",
      name, (long long)m, (long long)n, (long long)k, sec * 1e3,
      2.0 * m * n * k / sec / 1e12);
}

int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return std::atoll(argv[i] + prefix.size());
    }
  }
  return def;
}

}  // namespace
}  // namespace gpu
}  // namespace trainyard

int main(int argc, char** argv) {
  using namespace trainyard::gpu;
  const int64_t h = Flag(argc, argv, "hidden", 8192);
  const int64_t tokens = Flag(argc, argv, "tokens", 8192);
  const int iters = static_cast<int>(Flag(argc, argv, "iters", 10));
  absl::Status dev = CheckDevice(0);
  if (!dev.ok()) {
    std::fprintf(stderr, "mlp_benchmark: no CUDA device: %s\n",
                 dev.ToString().c_str());
    return 1;
  }
  RunGemm(GemmPrecision::kBFloat16, "bfloat16", h, tokens, iters);
  RunGemm(GemmPrecision::kTf32, "tf32", h, tokens, iters);
  for (bool epilogues : {true, false}) {
    RunMlp(ComputeMode::kBFloat16, "bfloat16", epilogues, h, tokens, iters);
    RunMlp(ComputeMode::kTf32, "tf32", epilogues, h, tokens, iters);
  }
  return 0;
}
