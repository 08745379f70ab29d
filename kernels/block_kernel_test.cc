#include "kernels/block_kernel.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/random.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "kernels/exec_context.h"
#include "kernels/mlp_block.h"
#include "kernels/packed_gemm.h"

namespace trainyard {
namespace {

Tensor Random(Rng* rng, Shape shape, float scale) {
  Tensor t = Tensor::Empty(DType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<float>()[i] = rng->Uniform(-scale, scale);
  }
  return t;
}

MlpBlockParams RandomParams(const MlpBlockConfig& c, Rng* rng) {
  MlpBlockParams p;
  const std::vector<ParamInfo> infos = BlockParamInfos(c);
  std::vector<Tensor*> slots = p.InOrder(c);
  for (size_t i = 0; i < infos.size(); ++i) {
    *slots[i] = Random(rng, infos[i].shape, 0.3f);
  }
  return p;
}

MlpBlockParams ZeroGrads(const MlpBlockConfig& c) {
  MlpBlockParams g;
  const std::vector<ParamInfo> infos = BlockParamInfos(c);
  std::vector<Tensor*> slots = g.InOrder(c);
  for (size_t i = 0; i < infos.size(); ++i) {
    *slots[i] = Tensor::Zeros(DType::kFloat32, infos[i].shape);
  }
  return g;
}

std::vector<MlpBlockConfig> Configs() {
  std::vector<MlpBlockConfig> out;
  for (Activation a : {Activation::kRelu, Activation::kGelu,
                       Activation::kGeluTanh, Activation::kSwiglu}) {
    for (NormType n :
         {NormType::kNone, NormType::kLayerNorm, NormType::kRmsNorm}) {
      MlpBlockConfig c;
      c.in_features = 33;
      c.out_features = 33;
      c.ffn_hidden_size = 17;
      c.activation = a;
      c.norm = n;
      c.residual = n != NormType::kNone;
      c.bias = a != Activation::kRelu;
      out.push_back(c);
    }
  }
  return out;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// The CPU BlockKernel is MlpBlock: bitwise the same outputs and gradients.
TEST(BlockKernelTest, CpuKernelIsMlpBlockBitwise) {
  auto ctx = *ExecContext::Create(Device::Cpu(), Precision::kFp32);
  for (const MlpBlockConfig& c : Configs()) {
    Rng rng(7, 1);
    MlpBlockParams params = RandomParams(c, &rng);
    Tensor x = Random(&rng, {5, c.in_features}, 1.0f);
    Tensor dy = Random(&rng, {5, c.out_features}, 1.0f);

    MlpBlock block(c);
    MlpBlockSaved saved;
    Tensor y_ref, dx_ref;
    ASSERT_TRUE(block.Forward(params, x, &y_ref, &saved).ok());
    ASSERT_TRUE(block.BackwardInput(params, dy, &saved, &dx_ref).ok());
    MlpBlockParams g_ref = ZeroGrads(c);
    ASSERT_TRUE(block.BackwardWeight(&saved, false, &g_ref).ok());

    auto kernel = CreateBlockKernel(c, ctx.get());
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    std::unique_ptr<BlockSaved> s;
    Tensor y, dx;
    ASSERT_TRUE((*kernel)->Forward(params, x, &y, &s).ok());
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE((*kernel)->BackwardInput(params, dy, s.get(), &dx).ok());
    MlpBlockParams g = ZeroGrads(c);
    ASSERT_TRUE((*kernel)->BackwardWeight(s.get(), false, &g).ok());

    EXPECT_TRUE(SameBits(y, y_ref));
    EXPECT_TRUE(SameBits(dx, dx_ref));
    std::vector<Tensor*> a = g.InOrder(c), b = g_ref.InOrder(c);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(SameBits(*a[i], *b[i]));

    // Eval: no saved state, same output.
    Tensor y_eval;
    ASSERT_TRUE((*kernel)->Forward(params, x, &y_eval, nullptr).ok());
    EXPECT_TRUE(SameBits(y_eval, y_ref));
  }
}

// Between BeginPasses and EndPasses a CPU block on the packed GEMM keeps
// the weights its first forward packed, and one microbatch's input gradient
// reads them (weight_reads 2: a training step of one microbatch); with a
// single read (one forward pass) it keeps nothing. The weights are changed
// after the forward, against BeginPasses' contract, so that a kept pack
// shows: the input gradient then still sees the old weights.
TEST(BlockKernelTest, OneMicrobatchInputGradientReadsTheForwardsPack) {
  const int64_t rows = 5;
  if (!UsePackedGemm(rows)) GTEST_SKIP() << "packed GEMM off: no packs";
  auto ctx = *ExecContext::Create(Device::Cpu(), Precision::kFp32);
  const MlpBlockConfig c = Configs()[3];  // GELU, no norm, bias
  Rng rng(9, 1);
  const MlpBlockParams old_params = RandomParams(c, &rng);
  const MlpBlockParams new_params = RandomParams(c, &rng);
  const Tensor x = Random(&rng, {rows, c.in_features}, 1.0f);
  const Tensor dy = Random(&rng, {rows, c.out_features}, 1.0f);
  // dx with the forward on old_params and the input gradient on `backward`.
  const auto dx_of = [&](int weight_reads, const MlpBlockParams& backward) {
    auto kernel = *CreateBlockKernel(c, ctx.get());
    kernel->BeginPasses(weight_reads);
    std::unique_ptr<BlockSaved> s;
    Tensor y, dx;
    EXPECT_TRUE(kernel->Forward(old_params, x, &y, &s).ok());
    EXPECT_TRUE(kernel->BackwardInput(backward, dy, s.get(), &dx).ok());
    kernel->EndPasses();
    return dx;
  };
  const Tensor with_old = dx_of(1, old_params);
  const Tensor with_new = dx_of(1, new_params);
  ASSERT_FALSE(SameBits(with_old, with_new));
  EXPECT_TRUE(SameBits(dx_of(2, new_params), with_old)) << "pack not read";
}

MlpBlockParams ToDevice(const ExecContext& ctx, const MlpBlockConfig& c,
                        MlpBlockParams host) {
  MlpBlockParams d;
  std::vector<Tensor*> src = host.InOrder(c), dst = d.InOrder(c);
  for (size_t i = 0; i < src.size(); ++i) *dst[i] = *ctx.ToDevice(*src[i]);
  return d;
}

// max |got - want| / (|want| + max |want|): relative where values are
// large, and for values near zero relative to the tensor's scale (as
// atol = rtol * scale), so rounding differences near zero do not count as
// errors.
double MaxRelErr(const Tensor& got, const Tensor& want) {
  double scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    scale =
        std::max(scale, std::abs(static_cast<double>(want.data<float>()[i])));
  }
  double worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.data<float>()[i], g = got.data<float>()[i];
    worst = std::max(worst, std::abs(g - w) / (std::abs(w) + scale + 1e-30));
  }
  return worst;
}

// The CUDA kernel against the CPU one, fp32 and bf16, for every activation
// and norm; gradients accumulate over two microbatches.
TEST(BlockKernelGpuTest, CudaMatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto cpu = *ExecContext::Create(Device::Cpu(), Precision::kFp32);
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    auto gpu = ExecContext::Create(Device::Cuda(0), p);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    const double tol = p == Precision::kFp32 ? 1e-4 : 5e-2;
    for (const MlpBlockConfig& c : Configs()) {
      SCOPED_TRACE(std::string(PrecisionName(p)) + " act " +
                   std::to_string(static_cast<int>(c.activation)) + " norm " +
                   std::to_string(static_cast<int>(c.norm)));
      Rng rng(11, 2);
      MlpBlockParams params = RandomParams(c, &rng);
      MlpBlockParams dparams = ToDevice(**gpu, c, params);
      auto ck = *CreateBlockKernel(c, cpu.get());
      auto gk = CreateBlockKernel(c, gpu->get());
      ASSERT_TRUE(gk.ok()) << gk.status();
      MlpBlockParams g_cpu = ZeroGrads(c);
      MlpBlockParams g_gpu = ToDevice(**gpu, c, ZeroGrads(c));
      for (int mb = 0; mb < 2; ++mb) {
        Tensor x = Random(&rng, {7, c.in_features}, 1.0f);
        Tensor dy = Random(&rng, {7, c.out_features}, 1.0f);
        std::unique_ptr<BlockSaved> sc, sg;
        Tensor yc, dxc, yg, dxg;
        ASSERT_TRUE(ck->Forward(params, x, &yc, &sc).ok());
        ASSERT_TRUE(ck->BackwardInput(params, dy, sc.get(), &dxc).ok());
        ASSERT_TRUE(ck->BackwardWeight(sc.get(), mb > 0, &g_cpu).ok());
        const DType act = (*gpu)->activation_dtype();
        Tensor xg = *(*gpu)->Cast(*(*gpu)->ToDevice(x), act);
        Tensor dyg = *(*gpu)->Cast(*(*gpu)->ToDevice(dy), act);
        absl::Status st = (*gk)->Forward(dparams, xg, &yg, &sg);
        ASSERT_TRUE(st.ok()) << st;
        st = (*gk)->BackwardInput(dparams, dyg, sg.get(), &dxg);
        ASSERT_TRUE(st.ok()) << st;
        st = (*gk)->BackwardWeight(sg.get(), mb > 0, &g_gpu);
        ASSERT_TRUE(st.ok()) << st;
        Tensor y = *(*gpu)->ToHost(*(*gpu)->Cast(yg, DType::kFloat32));
        Tensor dx = *(*gpu)->ToHost(*(*gpu)->Cast(dxg, DType::kFloat32));
        EXPECT_LT(MaxRelErr(y, yc), tol);
        EXPECT_LT(MaxRelErr(dx, dxc), tol);
      }
      std::vector<Tensor*> a = g_gpu.InOrder(c), b = g_cpu.InOrder(c);
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_LT(MaxRelErr(*(*gpu)->ToHost(*a[i]), *b[i]), tol) << i;
      }
    }
  }
}

}  // namespace
}  // namespace trainyard
