// CudaMlpBlock against the CPU MlpBlock (kernels/mlp_block.h): forward,
// input gradient and parameter gradients, per compute mode and config.
#include "kernels/cuda/cuda_mlp_block.h"

#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "kernels/mlp_block.h"

namespace trainyard {
namespace gpu {
namespace {

using testing::Download;
using testing::Upload;
constexpr DataType kF = DataType::kFloat32;

std::vector<float> Vec(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}
std::vector<double> D(const Tensor& t) {
  return std::vector<double>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(CudaMlpBlockTest, MatchesCpuBlockForEveryModeAndConfig) {
  SKIP_WITHOUT_CUDA_DEVICE();
  struct Case {
    Activation act;
    NormType norm;
    bool bias, residual;
  };
  const Case cases[] = {
      {Activation::kGelu, NormType::kLayerNorm, true, true},
      {Activation::kSwiglu, NormType::kRmsNorm, false, false},
      {Activation::kRelu, NormType::kNone, true, true},
      {Activation::kGeluTanh, NormType::kNone, true, false},
  };
  Rng rng(51);
  for (ComputeMode mode :
       {ComputeMode::kFloat32, ComputeMode::kTf32, ComputeMode::kBFloat16}) {
    const double tol = mode == ComputeMode::kFloat32 ? testing::kFp32Tol
                       : mode == ComputeMode::kTf32  ? testing::kTf32Tol
                                                     : testing::kBf16Tol;
    for (const Case& cs : cases) {
      MlpBlockConfig c;
      c.in_features = c.out_features = 33;
      c.ffn_hidden_size = 17;
      c.activation = cs.act;
      c.norm = cs.norm;
      c.bias = cs.bias;
      c.residual = cs.residual;
      SCOPED_TRACE(::testing::Message()
                   << "mode " << static_cast<int>(mode) << " act "
                   << static_cast<int>(cs.act) << " norm "
                   << static_cast<int>(cs.norm));
      const int64_t b = 9;
      // CPU block with random params; bf16 mode compares against CPU run on
      // bf16-rounded inputs and weights.
      MlpBlockParams p;
      std::vector<DeviceBuffer> keep;
      CudaMlpBlockParams dp;
      for (const ParamInfo& info : BlockParamInfos(c)) {
        std::vector<float> v = testing::RandomFloats(
            &rng, NumElements(info.shape), info.is_bias_or_norm ? 0.5f : 0.2f);
        if (mode == ComputeMode::kBFloat16 && !info.is_bias_or_norm) {
          v = testing::RoundToBf16(v);
        }
        Tensor t = Tensor::FromVector(v, info.shape);
        keep.push_back(Upload(v, kF));
        const float* ptr = keep.back().as<float>();
        if (info.name == "norm.weight") p.norm_weight = t, dp.norm_weight = ptr;
        if (info.name == "norm.bias") p.norm_bias = t, dp.norm_bias = ptr;
        if (info.name == "fc1.weight") p.fc1_weight = t, dp.fc1_weight = ptr;
        if (info.name == "fc1.bias") p.fc1_bias = t, dp.fc1_bias = ptr;
        if (info.name == "fc2.weight") p.fc2_weight = t, dp.fc2_weight = ptr;
        if (info.name == "fc2.bias") p.fc2_bias = t, dp.fc2_bias = ptr;
      }
      std::vector<float> x = testing::RandomFloats(&rng, b * 33, 1);
      std::vector<float> dy = testing::RandomFloats(&rng, b * 33, 1);
      const DataType at =
          mode == ComputeMode::kBFloat16 ? DataType::kBFloat16 : kF;
      if (at != kF) {
        x = testing::RoundToBf16(x);
        dy = testing::RoundToBf16(dy);
      }
      MlpBlock cpu(c);
      Tensor y, dx;
      MlpBlockSaved saved;
      ASSERT_TRUE(
          cpu.Forward(p, Tensor::FromVector(x, {b, 33}), &y, &saved).ok());
      ASSERT_TRUE(
          cpu.BackwardInput(p, Tensor::FromVector(dy, {b, 33}), &saved, &dx)
              .ok());
      MlpBlockParams grads;
      ASSERT_TRUE(cpu.BackwardWeight(&saved, false, &grads).ok());

      auto block = CudaMlpBlock::Create(c, mode, 0);
      ASSERT_TRUE(block.ok()) << block.status();
      DeviceBuffer d_x = Upload(x, at), d_dy = Upload(dy, at);
      DeviceBuffer d_y = testing::Poisoned(b * 33, at),
                   d_dx = testing::Poisoned(b * 33, at);
      CudaMlpBlockSaved ds;
      absl::Status s =
          (*block)->Forward(dp, b, d_x.data(), d_y.data(), &ds, nullptr);
      ASSERT_TRUE(s.ok()) << s;
      s = (*block)->BackwardInput(dp, d_dy.data(), &ds, d_dx.data(), nullptr);
      ASSERT_TRUE(s.ok()) << s;
      CudaMlpBlockGrads dg;
      std::vector<DeviceBuffer> gbufs;
      auto grad_buf = [&](const Tensor& t) {
        gbufs.push_back(testing::Poisoned(t.numel(), kF));
        return gbufs.back().as<float>();
      };
      if (grads.norm_weight.defined())
        dg.norm_weight = grad_buf(grads.norm_weight);
      if (grads.norm_bias.defined()) dg.norm_bias = grad_buf(grads.norm_bias);
      dg.fc1_weight = grad_buf(grads.fc1_weight);
      dg.fc2_weight = grad_buf(grads.fc2_weight);
      if (c.bias) {
        dg.fc1_bias = grad_buf(grads.fc1_bias);
        dg.fc2_bias = grad_buf(grads.fc2_bias);
      }
      s = (*block)->BackwardWeight(&ds, false, dg, nullptr);
      ASSERT_TRUE(s.ok()) << s;
      const double atol = tol * 10;  // sums over up to 33 terms of O(1)
      EXPECT_TRUE(
          testing::AllClose("y", Download(d_y, b * 33, at), D(y), tol, atol));
      EXPECT_TRUE(testing::AllClose("dx", Download(d_dx, b * 33, at), D(dx),
                                    tol, atol));
      auto check = [&](const char* name, float* dev, const Tensor& ref) {
        std::vector<float> got(ref.numel());
        ASSERT_TRUE(
            CopyDeviceToHost(got.data(), dev, got.size() * 4, nullptr).ok());
        EXPECT_TRUE(testing::AllClose(name, got, D(ref), tol, atol));
      };
      check("grad fc1.weight", dg.fc1_weight, grads.fc1_weight);
      check("grad fc2.weight", dg.fc2_weight, grads.fc2_weight);
      if (c.bias) {
        check("grad fc1.bias", dg.fc1_bias, grads.fc1_bias);
        check("grad fc2.bias", dg.fc2_bias, grads.fc2_bias);
      }
      if (dg.norm_weight)
        check("grad norm.weight", dg.norm_weight, grads.norm_weight);
      if (dg.norm_bias) check("grad norm.bias", dg.norm_bias, grads.norm_bias);
    }
  }
}

}  // namespace
}  // namespace gpu
}  // namespace trainyard
