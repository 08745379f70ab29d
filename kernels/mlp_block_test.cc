#include "kernels/mlp_block.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/blas.h"
#include "kernels/linear.h"
#include "kernels/norm.h"
#include "kernels/packed_gemm.h"
#include "kernels/reference.h"

namespace trainyard {
namespace {

using reference::AllClose;
using reference::BlockParams;
using reference::Vec;

// float32 block against float64: GEMM sums of up to ~1000 terms of size ~1.
constexpr double kRtol = 1e-4;
constexpr double kAtol = 2e-5;

std::string Describe(const MlpBlockConfig& c, int64_t b) {
  return std::string(reference::ActivationName(c.activation)) + "/" +
         reference::NormName(c.norm) + (c.bias ? "/bias" : "/nobias") +
         (c.residual ? "/residual" : "") + " b=" + std::to_string(b) +
         " in=" + std::to_string(c.in_features) +
         " ffn=" + std::to_string(c.ffn_hidden_size) +
         " out=" + std::to_string(c.out_features);
}

Tensor ToTensor(const Vec& v, Shape shape) {
  return Tensor::FromVector(reference::ToFloat(v), std::move(shape));
}

// Random parameters in both float32 tensors and float64 vectors (same
// values). nn.Linear-like scale 1/sqrt(fan_in).
void RandomParams(const MlpBlockConfig& c, Rng* rng, MlpBlockParams* p,
                  BlockParams* ref) {
  const int64_t in = c.in_features, out = c.out_features,
                ffn = c.ffn_hidden_size, f1 = c.fc1_out();
  if (c.norm != NormType::kNone) {
    ref->norm_weight = reference::RandomVec(rng, in, 0.3);
    for (double& w : ref->norm_weight) w = static_cast<float>(w + 1.0);
    p->norm_weight = ToTensor(ref->norm_weight, {in});
  }
  if (c.norm == NormType::kLayerNorm) {
    ref->norm_bias = reference::RandomVec(rng, in, 0.3);
    p->norm_bias = ToTensor(ref->norm_bias, {in});
  }
  ref->fc1_weight = reference::RandomVec(rng, f1 * in, 1.0 / std::sqrt(in));
  p->fc1_weight = ToTensor(ref->fc1_weight, {f1, in});
  ref->fc2_weight = reference::RandomVec(rng, out * ffn, 1.0 / std::sqrt(ffn));
  p->fc2_weight = ToTensor(ref->fc2_weight, {out, ffn});
  if (c.bias) {
    ref->fc1_bias = reference::RandomVec(rng, f1, 0.5);
    p->fc1_bias = ToTensor(ref->fc1_bias, {f1});
    ref->fc2_bias = reference::RandomVec(rng, out, 0.5);
    p->fc2_bias = ToTensor(ref->fc2_bias, {out});
  }
}

// Compares every gradient the config has.
void ExpectGradsClose(const MlpBlockConfig& c, const std::string& what,
                      MlpBlockParams& got, const BlockParams& want) {
  const std::vector<ParamInfo> infos = BlockParamInfos(c);
  const std::vector<Tensor*> tensors = got.InOrder(c);
  ASSERT_EQ(infos.size(), tensors.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    const std::string& name = infos[i].name;
    const Vec& w = name == "norm.weight"  ? want.norm_weight
                   : name == "norm.bias"  ? want.norm_bias
                   : name == "fc1.weight" ? want.fc1_weight
                   : name == "fc1.bias"   ? want.fc1_bias
                   : name == "fc2.weight" ? want.fc2_weight
                                          : want.fc2_bias;
    ASSERT_TRUE(tensors[i]->defined()) << what << " " << name;
    ASSERT_EQ(tensors[i]->numel(), static_cast<int64_t>(w.size()))
        << what << " " << name;
    EXPECT_TRUE(AllClose((what + " grad " + name).c_str(),
                         tensors[i]->data<float>(), w, kRtol, kAtol));
  }
}

std::vector<MlpBlockConfig> AllConfigs(int64_t in, int64_t out, int64_t ffn) {
  std::vector<MlpBlockConfig> configs;
  for (Activation act : {Activation::kRelu, Activation::kGelu,
                         Activation::kGeluTanh, Activation::kSwiglu}) {
    for (NormType norm :
         {NormType::kNone, NormType::kLayerNorm, NormType::kRmsNorm}) {
      for (bool bias : {false, true}) {
        for (bool residual : {false, true}) {
          MlpBlockConfig c;
          c.in_features = in;
          c.out_features = residual ? in : out;
          c.ffn_hidden_size = ffn;
          c.activation = act;
          c.norm = norm;
          c.bias = bias;
          c.residual = residual;
          configs.push_back(c);
        }
      }
    }
  }
  return configs;
}

// Every activation x norm x bias x residual: forward, dx and all parameter
// gradients against the float64 reference.
TEST(MlpBlockTest, EveryConfigMatchesFloat64Reference) {
  Rng rng(41);
  struct Dims {
    int64_t b, in, out, ffn;
  };
  for (const Dims& d :
       {Dims{3, 17, 5, 9}, Dims{1, 3, 1, 1009}, Dims{17, 1, 3, 17}}) {
    for (const MlpBlockConfig& c : AllConfigs(d.in, d.out, d.ffn)) {
      const std::string what = Describe(c, d.b);
      MlpBlockParams params;
      BlockParams ref;
      RandomParams(c, &rng, &params, &ref);
      const Vec x = reference::RandomVec(&rng, d.b * c.in_features, 1.0);
      const Vec dy = reference::RandomVec(&rng, d.b * c.out_features, 1.0);
      MlpBlock block(c);
      Tensor y, dx;
      MlpBlockSaved saved;
      ASSERT_TRUE(
          block.Forward(params, ToTensor(x, {d.b, c.in_features}), &y, &saved)
              .ok())
          << what;
      ASSERT_EQ(y.shape(), (Shape{d.b, c.out_features})) << what;
      EXPECT_TRUE(AllClose((what + " y").c_str(), y.data<float>(),
                           reference::BlockForward(c, ref, d.b, x), kRtol,
                           kAtol));
      ASSERT_TRUE(block
                      .BackwardInput(params,
                                     ToTensor(dy, {d.b, c.out_features}),
                                     &saved, &dx)
                      .ok())
          << what;
      MlpBlockParams grads;
      ASSERT_TRUE(block.BackwardWeight(&saved, false, &grads).ok()) << what;
      EXPECT_FALSE(saved.fc1_out.defined()) << "saved tensors not released";
      Vec want_dx;
      BlockParams want_grads;
      reference::BlockBackward(c, ref, d.b, x, dy, &want_dx, &want_grads);
      ASSERT_EQ(dx.shape(), (Shape{d.b, c.in_features})) << what;
      EXPECT_TRUE(AllClose((what + " dx").c_str(), dx.data<float>(), want_dx,
                           kRtol, kAtol));
      ExpectGradsClose(c, what, grads, want_grads);
    }
  }
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The float64 reference's analytic gradients agree with central
// differences of its forward, for every config (a few coordinates each).
TEST(MlpBlockReferenceTest, GradientsMatchFiniteDifferences) {
  Rng rng(42);
  const int64_t b = 3;
  for (const MlpBlockConfig& c : AllConfigs(5, 4, 7)) {
    const std::string what = Describe(c, b);
    MlpBlockParams unused;
    BlockParams ref;
    RandomParams(c, &rng, &unused, &ref);
    const Vec x = reference::RandomVec(&rng, b * c.in_features, 1.0);
    const Vec dy = reference::RandomVec(&rng, b * c.out_features, 1.0);
    Vec dx;
    BlockParams grads;
    reference::BlockBackward(c, ref, b, x, dy, &dx, &grads);
    const double h = 1e-6;
    auto check = [&](Vec* v, const Vec& g, const char* name, const Vec* xin) {
      for (size_t i = 0; i < v->size(); i += 1 + v->size() / 4) {
        const double orig = (*v)[i];
        (*v)[i] = orig + h;
        const double plus = Dot(reference::BlockForward(c, ref, b, *xin), dy);
        (*v)[i] = orig - h;
        const double minus = Dot(reference::BlockForward(c, ref, b, *xin), dy);
        (*v)[i] = orig;
        EXPECT_NEAR(g[i], (plus - minus) / (2 * h), 2e-6)
            << what << " " << name << "[" << i << "]";
      }
    };
    Vec xv = x;
    check(&xv, dx, "x", &xv);
    check(&ref.fc1_weight, grads.fc1_weight, "fc1.weight", &x);
    check(&ref.fc2_weight, grads.fc2_weight, "fc2.weight", &x);
    if (c.bias) {
      check(&ref.fc1_bias, grads.fc1_bias, "fc1.bias", &x);
      check(&ref.fc2_bias, grads.fc2_bias, "fc2.bias", &x);
    }
    if (c.norm != NormType::kNone) {
      check(&ref.norm_weight, grads.norm_weight, "norm.weight", &x);
    }
    if (c.norm == NormType::kLayerNorm) {
      check(&ref.norm_bias, grads.norm_bias, "norm.bias", &x);
    }
  }
}

// BackwardWeight(accumulate=false) then (accumulate=true) equals the sum
// of the two microbatches' gradients; first block (dx == nullptr) too.
TEST(MlpBlockTest, BackwardWeightAccumulatesMicrobatches) {
  Rng rng(43);
  for (const MlpBlockConfig& c : AllConfigs(17, 17, 33)) {
    const int64_t b1 = 3, b2 = 5;
    const std::string what = Describe(c, b1);
    MlpBlockParams params;
    BlockParams ref;
    RandomParams(c, &rng, &params, &ref);
    MlpBlock block(c);
    MlpBlockParams grads;
    BlockParams want;
    // Garbage in the gradient buffers must be overwritten, not added to.
    std::vector<Tensor*> gt = grads.InOrder(c);
    for (size_t i = 0; i < gt.size(); ++i) {
      *gt[i] = Tensor::Empty(DType::kFloat32, BlockParamInfos(c)[i].shape);
      gt[i]->Fill(1e30f);
    }
    int64_t mb = 0;
    for (int64_t b : {b1, b2}) {
      const Vec x = reference::RandomVec(&rng, b * c.in_features, 1.0);
      const Vec dy = reference::RandomVec(&rng, b * c.out_features, 1.0);
      Tensor y;
      MlpBlockSaved saved;
      ASSERT_TRUE(
          block.Forward(params, ToTensor(x, {b, c.in_features}), &y, &saved)
              .ok());
      ASSERT_TRUE(block
                      .BackwardInput(params, ToTensor(dy, {b, c.out_features}),
                                     &saved, /*dx=*/nullptr)
                      .ok());
      ASSERT_TRUE(
          block.BackwardWeight(&saved, /*accumulate=*/mb > 0, &grads).ok());
      Vec dx;
      BlockParams g;
      reference::BlockBackward(c, ref, b, x, dy, &dx, &g);
      if (mb == 0) {
        want = g;
      } else {
        for (auto [w, add] : {std::make_pair(&want.norm_weight, &g.norm_weight),
                              std::make_pair(&want.norm_bias, &g.norm_bias),
                              std::make_pair(&want.fc1_weight, &g.fc1_weight),
                              std::make_pair(&want.fc1_bias, &g.fc1_bias),
                              std::make_pair(&want.fc2_weight, &g.fc2_weight),
                              std::make_pair(&want.fc2_bias, &g.fc2_bias)}) {
          for (size_t i = 0; i < w->size(); ++i) (*w)[i] += (*add)[i];
        }
      }
      ++mb;
    }
    ExpectGradsClose(c, what + " accumulated", grads, want);
  }
}

// Same inputs give the same bits, whatever the BLAS thread count.
// Every activation x norm, with bias and residual, at a size where the
// GEMM epilogues, the row-threaded norms and the column-threaded bias
// gradients all split their work: the same bits on 1 and 2 threads and on
// repeated runs.
// BackwardWeights over a step's microbatches gives the bits of one
// BackwardWeight each, in order: chained on the packed GEMM (consecutive
// microbatches of at most PackedGemmMaxRows() rows), per microbatch on
// OpenBLAS (the one a row over that, where the packed GEMM is on), mixed in
// a run.
TEST(MlpBlockTest, BackwardWeightsGiveTheBitsOfOneCallEach) {
  const int64_t h = 40, ffn = 72;
  const std::vector<int64_t> rows = {7, 32, 1, PackedGemmMaxRows() + 1, 64, 5};
  for (const MlpBlockConfig& c : AllConfigs(h, h, ffn)) {
    if (!c.bias) continue;
    for (bool accumulate : {false, true}) {
      Rng rng(77);
      MlpBlockParams p;
      BlockParams ref;
      RandomParams(c, &rng, &p, &ref);
      MlpBlock block(c);
      std::vector<MlpBlockSaved> one(rows.size()), chained(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        const int64_t b = rows[i];
        const Tensor x =
            ToTensor(reference::RandomVec(&rng, b * h, 1.0), {b, h});
        const Tensor dy =
            ToTensor(reference::RandomVec(&rng, b * h, 1.0), {b, h});
        Tensor y, dx;
        ASSERT_TRUE(block.Forward(p, x, &y, &one[i]).ok());
        ASSERT_TRUE(block.BackwardInput(p, dy, &one[i], &dx).ok());
        EXPECT_FALSE(one[i].fc1_out.defined())
            << "BackwardInput keeps fc1_out, which nothing reads after it";
        chained[i] = one[i];  // shares the tensors
      }
      // Starting values: garbage when overwriting, a gradient when not.
      MlpBlockParams want, got;
      std::vector<Tensor*> wt = want.InOrder(c), gt = got.InOrder(c);
      const std::vector<ParamInfo> infos = BlockParamInfos(c);
      for (size_t i = 0; i < wt.size(); ++i) {
        const Shape& shape = infos[i].shape;
        *wt[i] = Tensor::Empty(DType::kFloat32, shape);
        *gt[i] = Tensor::Empty(DType::kFloat32, shape);
        const Vec v = reference::RandomVec(&rng, wt[i]->numel(), 1.0);
        for (int64_t j = 0; j < wt[i]->numel(); ++j) {
          wt[i]->data<float>()[j] = gt[i]->data<float>()[j] =
              accumulate ? static_cast<float>(v[j]) : 1e30f;
        }
      }
      for (size_t i = 0; i < rows.size(); ++i) {
        ASSERT_TRUE(
            block.BackwardWeight(&one[i], accumulate || i > 0, &want).ok());
      }
      std::vector<MlpBlockSaved*> saved;
      for (MlpBlockSaved& s : chained) saved.push_back(&s);
      ASSERT_TRUE(block.BackwardWeights(saved, accumulate, &got).ok());
      for (size_t i = 0; i < wt.size(); ++i) {
        EXPECT_EQ(0, std::memcmp(gt[i]->data<float>(), wt[i]->data<float>(),
                                 wt[i]->numel() * sizeof(float)))
            << Describe(c, 0) << " accumulate=" << accumulate << ": "
            << infos[i].name;
      }
      for (const MlpBlockSaved& s : chained) {
        EXPECT_FALSE(s.d_out.defined()) << "saved tensors not released";
      }
      // Released: a second call is refused, naming the microbatch.
      absl::Status st = block.BackwardWeights(saved, true, &got);
      EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(st.message().find("microbatch 0 of 6"), std::string::npos)
          << st.message();
    }
  }
}

TEST(MlpBlockTest, BitwiseDeterministicAcrossRunsAndThreadCounts) {
  const int64_t b = 300, h = 512, ffn = 640;  // norms: 2 ranges of rows
  for (const MlpBlockConfig& c : AllConfigs(h, h, ffn)) {
    if (!c.bias || !c.residual) continue;
    Rng rng(44);
    MlpBlockParams params;
    BlockParams ref;
    RandomParams(c, &rng, &params, &ref);
    const Tensor x = ToTensor(reference::RandomVec(&rng, b * h, 1.0), {b, h});
    const Tensor dy = ToTensor(reference::RandomVec(&rng, b * h, 1.0), {b, h});
    MlpBlock block(c);
    std::vector<std::vector<float>> runs;
    for (int threads : {2, 1, 2}) {
      SetBlasThreads(threads);
      Tensor y, dx;
      MlpBlockSaved saved;
      MlpBlockParams grads;
      ASSERT_TRUE(block.Forward(params, x, &y, &saved).ok());
      ASSERT_TRUE(block.BackwardInput(params, dy, &saved, &dx).ok());
      ASSERT_TRUE(block.BackwardWeight(&saved, false, &grads).ok());
      std::vector<float> all;
      for (const Tensor* t : {&y, &dx}) {
        all.insert(all.end(), t->data<float>(), t->data<float>() + t->numel());
      }
      for (Tensor* t : grads.InOrder(c)) {
        all.insert(all.end(), t->data<float>(), t->data<float>() + t->numel());
      }
      runs.push_back(all);
    }
    SetBlasThreads(2);
    for (size_t i = 1; i < runs.size(); ++i) {
      ASSERT_EQ(runs[0].size(), runs[i].size());
      EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[i].data(),
                               runs[0].size() * sizeof(float)))
          << Describe(c, b) << " run " << i;
    }
  }
}

// out [b, n] = x [b, k] @ op(w) through the GEMM the block uses for its
// weights: the packed GEMM when enabled (w packed for this call), else
// OpenBLAS (UsePackedGemm); w is [n, k] when transposed, else [k, n].
void WeightGemm(bool transposed, int64_t b, int64_t n, int64_t k,
                const float* x, const float* w, float* out) {
  const int64_t ldw = transposed ? k : n;
  if (!UsePackedGemm(b)) {
    EXPECT_TRUE(
        Sgemm(false, transposed, b, n, k, 1.0f, x, k, w, ldw, 0.0f, out, n)
            .ok());
    return;
  }
  PackedMatrix packed;
  ASSERT_TRUE(packed.Pack(transposed, k, n, w, ldw).ok());
  EXPECT_TRUE(SgemmPacked(b, x, k, packed, false, out, n).ok());
}

// g [m, n] = dy^T [m, b] @ x [b, n], a weight gradient, through the GEMM
// the block uses: SgemmWeightGradient when UsePackedGemm(b), else OpenBLAS.
void WeightGradientGemm(int64_t b, int64_t m, int64_t n, const float* dy,
                        const float* x, float* g) {
  if (!UsePackedGemm(b)) {
    EXPECT_TRUE(
        Sgemm(true, false, m, n, b, 1.0f, dy, m, x, n, 0.0f, g, n).ok());
    return;
  }
  EXPECT_TRUE(SgemmWeightGradient(m, n, {{b, dy, m, x, n}}, false, g, n).ok());
}

// What the block computes, as separate whole-matrix passes on one thread
// after each GEMM: y, dx, then the gradients in InOrder's order.
std::vector<std::vector<float>> SeparatePasses(const MlpBlockConfig& c,
                                               MlpBlockParams& p,
                                               const Tensor& xt,
                                               const Tensor& dyt) {
  const int64_t b = xt.dim(0), in = c.in_features, out = c.out_features,
                ffn = c.ffn_hidden_size, f1 = c.fc1_out();
  const float* x = xt.data<float>();
  const float* dy = dyt.data<float>();
  const float* w1 = p.fc1_weight.data<float>();
  const float* w2 = p.fc2_weight.data<float>();
  const float* nw =
      c.norm == NormType::kNone ? nullptr : p.norm_weight.data<float>();
  std::vector<float> norm_out(x, x + b * in), mean(b), rstd(b);
  if (c.norm == NormType::kLayerNorm) {
    LayerNormForward(b, in, x, nw, p.norm_bias.data<float>(), c.norm_eps,
                     norm_out.data(), mean.data(), rstd.data());
  } else if (c.norm == NormType::kRmsNorm) {
    RmsNormForward(b, in, x, nw, c.norm_eps, norm_out.data(), rstd.data());
  }
  std::vector<float> pre(b * f1), act(b * ffn), y(b * out), d_act(b * ffn),
      d_fc1(b * f1), d_norm(b * in), dx(b * in);
  WeightGemm(true, b, f1, in, norm_out.data(), w1, pre.data());
  const float* b1 = p.fc1_bias.data<float>();
  switch (c.activation) {
    case Activation::kRelu:
      BiasReluForward(b, ffn, b1, pre.data(), act.data());
      break;
    case Activation::kGelu:
      BiasGeluForward(b, ffn, b1, pre.data(), act.data());
      break;
    case Activation::kGeluTanh:
      BiasGeluTanhForward(b, ffn, b1, pre.data(), act.data());
      break;
    case Activation::kSwiglu:
      BiasSwigluForward(b, ffn, b1, pre.data(), act.data());
      break;
  }
  WeightGemm(true, b, out, ffn, act.data(), w2, y.data());
  AddBiasResidual(b, out, p.fc2_bias.data<float>(), x, y.data());
  WeightGemm(false, b, ffn, out, dy, w2, d_act.data());
  switch (c.activation) {
    case Activation::kRelu:
      ReluBackward(b * ffn, pre.data(), d_act.data());
      break;
    case Activation::kGelu:
      GeluBackward(b * ffn, pre.data(), d_act.data());
      break;
    case Activation::kGeluTanh:
      GeluTanhBackward(b * ffn, pre.data(), d_act.data());
      break;
    case Activation::kSwiglu:
      SwigluBackward(b, ffn, pre.data(), d_act.data(), d_fc1.data());
      break;
  }
  if (c.activation != Activation::kSwiglu) d_fc1 = d_act;
  WeightGemm(false, b, in, f1, d_fc1.data(), w1, d_norm.data());
  if (c.norm == NormType::kLayerNorm) {
    LayerNormBackwardInput(b, in, x, nw, mean.data(), rstd.data(),
                           d_norm.data(), dy, dx.data());
  } else if (c.norm == NormType::kRmsNorm) {
    RmsNormBackwardInput(b, in, x, nw, rstd.data(), d_norm.data(), dy,
                         dx.data());
  } else {
    dx = d_norm;
    AddBiasResidual(b, in, nullptr, dy, dx.data());
  }
  // Gradients; each column summed over the rows in row order.
  std::vector<float> g_nw(in, 0.0f), g_nb(in, 0.0f), g_w1(f1 * in),
      g_b1(f1, 0.0f), g_w2(out * ffn), g_b2(out, 0.0f);
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t j = 0; j < in; ++j) {
      const float g = d_norm[r * in + j], xv = x[r * in + j];
      g_nw[j] += c.norm == NormType::kLayerNorm ? g * ((xv - mean[r]) * rstd[r])
                                                : g * (xv * rstd[r]);
      g_nb[j] += g;
    }
    for (int64_t j = 0; j < f1; ++j) g_b1[j] += d_fc1[r * f1 + j];
    for (int64_t j = 0; j < out; ++j) g_b2[j] += dy[r * out + j];
  }
  WeightGradientGemm(b, out, ffn, dy, act.data(), g_w2.data());
  WeightGradientGemm(b, f1, in, d_fc1.data(), norm_out.data(), g_w1.data());
  std::vector<std::vector<float>> all = {y, dx};
  if (c.norm != NormType::kNone) all.push_back(g_nw);
  if (c.norm == NormType::kLayerNorm) all.push_back(g_nb);
  for (auto* g : {&g_w1, &g_b1, &g_w2, &g_b2}) all.push_back(*g);
  return all;
}

// The block fuses bias + activation into fc1's GEMM, bias + residual into
// fc2's, the activation's backward into the d(act) GEMM and the residual's
// gradient into the dx GEMM, threads the norms over rows and the bias and
// norm gradients over columns: for every activation and norm, at a size
// where every one of those splits its work, each result is bitwise what
// separate single-threaded passes after each GEMM give.
TEST(MlpBlockTest, FusedEpiloguesMatchSeparatePassesBitwise) {
  const int64_t h = 256, ffn = 384;
  // 60 rows: the packed GEMM where enabled; 520: OpenBLAS.
  for (const int64_t b : {60, 520}) {
    for (const MlpBlockConfig& c : AllConfigs(h, h, ffn)) {
      if (!c.bias || !c.residual) continue;
      Rng rng(45);
      MlpBlockParams p;
      BlockParams ref;
      RandomParams(c, &rng, &p, &ref);
      const Tensor x = ToTensor(reference::RandomVec(&rng, b * h, 1.0), {b, h});
      const Tensor dy =
          ToTensor(reference::RandomVec(&rng, b * h, 1.0), {b, h});
      MlpBlock block(c);
      Tensor y, dx;
      MlpBlockSaved saved;
      MlpBlockParams grads;
      ASSERT_TRUE(block.Forward(p, x, &y, &saved).ok());
      ASSERT_TRUE(block.BackwardInput(p, dy, &saved, &dx).ok());
      ASSERT_TRUE(block.BackwardWeight(&saved, false, &grads).ok());
      std::vector<const Tensor*> got = {&y, &dx};
      for (Tensor* t : grads.InOrder(c)) got.push_back(t);
      const std::vector<std::vector<float>> want = SeparatePasses(c, p, x, dy);
      ASSERT_EQ(got.size(), want.size()) << Describe(c, b);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i]->numel(), static_cast<int64_t>(want[i].size()));
        EXPECT_EQ(0, std::memcmp(got[i]->data<float>(), want[i].data(),
                                 want[i].size() * sizeof(float)))
            << Describe(c, b) << ": output " << i
            << " (y, dx, then the gradients in InOrder's order)";
      }
    }
  }
}

// y and dx of one microbatch.
struct Outputs {
  Tensor y, dx;
};
Outputs RunForwardBackward(const MlpBlock& block, const MlpBlockParams& p,
                           const Tensor& x, const Tensor& dy) {
  Outputs out;
  MlpBlockSaved saved;
  EXPECT_TRUE(block.Forward(p, x, &out.y, &saved).ok());
  EXPECT_TRUE(block.BackwardInput(p, dy, &saved, &out.dx).ok());
  return out;
}
bool SameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data<float>(), b.data<float>(),
                                               a.numel() * sizeof(float)) == 0;
}

// A block keeping its packs (MlpBlockParams::packed, as a stage's CPU
// blocks do over a step's microbatches: the first microbatch packs, the
// others read the packs) gives the bits of packing in every GEMM; after the
// weights change, Reset makes the next microbatch pack again (without it
// the stale packs are used: they really are read). Packs of another
// block's shapes are refused.
TEST(MlpBlockTest, KeptPacksGiveThePerGemmBits) {
  if (!UsePackedGemm(32)) GTEST_SKIP() << "OpenBLAS: no packs";
  const MlpBlockConfig c = AllConfigs(48, 48, 80)[0];
  Rng rng(12);
  MlpBlockParams p;
  BlockParams ref;
  RandomParams(c, &rng, &p, &ref);
  MlpBlock block(c);
  MlpBlockPacked packed;
  MlpBlockParams keeping = p;
  keeping.packed = &packed;
  const auto rows = [&](int64_t b) {
    return ToTensor(reference::RandomVec(&rng, b * 48, 1.0), {b, 48});
  };
  // The largest microbatch this CPU runs on the packed GEMM (256 rows with
  // AVX-512) too.
  for (int64_t b : {int64_t{7}, int64_t{32}, int64_t{1}, PackedGemmMaxRows()}) {
    const Tensor x = rows(b), dy = rows(b);
    const Outputs fresh = RunForwardBackward(block, p, x, dy);
    const Outputs kept = RunForwardBackward(block, keeping, x, dy);
    EXPECT_TRUE(SameBits(fresh.y, kept.y)) << "rows " << b;
    EXPECT_TRUE(SameBits(fresh.dx, kept.dx)) << "rows " << b;
    EXPECT_TRUE(packed.fc1.ready && packed.fc2.ready);
  }
  // New weights, in place.
  for (Tensor* t : {&p.fc1_weight, &p.fc2_weight}) {
    float* w = t->data<float>();
    for (int64_t i = 0; i < t->numel(); ++i) w[i] *= 0.5f + (i % 3) * 0.25f;
  }
  keeping = p;
  keeping.packed = &packed;
  const Tensor x = rows(9), dy = rows(9);
  const Outputs fresh = RunForwardBackward(block, p, x, dy);
  const Outputs stale = RunForwardBackward(block, keeping, x, dy);
  EXPECT_FALSE(SameBits(fresh.y, stale.y));
  packed.Reset();
  const Outputs repacked = RunForwardBackward(block, keeping, x, dy);
  EXPECT_TRUE(SameBits(fresh.y, repacked.y));
  EXPECT_TRUE(SameBits(fresh.dx, repacked.dx));

  MlpBlockConfig wider = c;
  wider.ffn_hidden_size = 96;
  MlpBlockParams wide;
  BlockParams wide_ref;
  RandomParams(wider, &rng, &wide, &wide_ref);
  MlpBlockPacked other;
  wide.packed = &other;
  RunForwardBackward(MlpBlock(wider), wide, x, dy);
  keeping.packed = &other;
  Tensor y;
  MlpBlockSaved saved;
  const absl::Status st = block.Forward(keeping, x, &y, &saved);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("packed fc1.weight holds [48, 96]"),
            std::string::npos)
      << st.message();
}

TEST(MlpBlockTest, NamesParseAndErrorsListAllowedValues) {
  EXPECT_EQ(*ActivationFromName("relu"), Activation::kRelu);
  EXPECT_EQ(*ActivationFromName("gelu"), Activation::kGelu);
  EXPECT_EQ(*ActivationFromName("gelu_tanh"), Activation::kGeluTanh);
  EXPECT_EQ(*ActivationFromName("swiglu"), Activation::kSwiglu);
  const absl::Status act = ActivationFromName("tanh").status();
  EXPECT_EQ(act.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(act.message().find("\"tanh\""), std::string::npos) << act;
  EXPECT_NE(act.message().find("gelu_tanh"), std::string::npos) << act;
  EXPECT_EQ(*NormTypeFromName("none"), NormType::kNone);
  EXPECT_EQ(*NormTypeFromName("layernorm"), NormType::kLayerNorm);
  EXPECT_EQ(*NormTypeFromName("rmsnorm"), NormType::kRmsNorm);
  const absl::Status norm = NormTypeFromName("LayerNorm").status();
  EXPECT_EQ(norm.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(norm.message().find("layernorm"), std::string::npos) << norm;
  EXPECT_NE(norm.message().find("rmsnorm"), std::string::npos) << norm;
}

TEST(MlpBlockTest, ParamInfosInCheckpointOrder) {
  MlpBlockConfig c;
  c.in_features = 4;
  c.out_features = 6;
  c.ffn_hidden_size = 8;
  c.activation = Activation::kSwiglu;
  c.norm = NormType::kLayerNorm;
  c.bias = true;
  const std::vector<ParamInfo> infos = BlockParamInfos(c);
  ASSERT_EQ(infos.size(), 6u);
  const std::vector<std::string> names = {"norm.weight", "norm.bias",
                                          "fc1.weight",  "fc1.bias",
                                          "fc2.weight",  "fc2.bias"};
  const std::vector<Shape> shapes = {{4}, {4}, {16, 4}, {16}, {6, 8}, {6}};
  for (size_t i = 0; i < infos.size(); ++i) {
    EXPECT_EQ(infos[i].name, names[i]);
    EXPECT_EQ(infos[i].shape, shapes[i]) << names[i];
    EXPECT_EQ(infos[i].is_bias_or_norm,
              names[i] != "fc1.weight" && names[i] != "fc2.weight")
        << names[i];
  }
  MlpBlockParams p;
  const std::vector<Tensor*> order = p.InOrder(c);
  EXPECT_EQ(order,
            (std::vector<Tensor*>{&p.norm_weight, &p.norm_bias, &p.fc1_weight,
                                  &p.fc1_bias, &p.fc2_weight, &p.fc2_bias}));
  c.norm = NormType::kRmsNorm;
  c.bias = false;
  c.activation = Activation::kRelu;
  const std::vector<ParamInfo> rms = BlockParamInfos(c);
  ASSERT_EQ(rms.size(), 3u);
  EXPECT_EQ(rms[0].name, "norm.weight");
  EXPECT_TRUE(rms[0].is_bias_or_norm);
  EXPECT_EQ(rms[1].name, "fc1.weight");
  EXPECT_EQ(rms[1].shape, (Shape{8, 4}));
  EXPECT_FALSE(rms[1].is_bias_or_norm);
  EXPECT_EQ(rms[2].name, "fc2.weight");
  EXPECT_EQ(p.InOrder(c), (std::vector<Tensor*>{&p.norm_weight, &p.fc1_weight,
                                                &p.fc2_weight}));
}

TEST(MlpBlockTest, RejectsBadShapesAndOrder) {
  MlpBlockConfig c;
  c.in_features = 4;
  c.out_features = 4;
  c.ffn_hidden_size = 8;
  Rng rng(45);
  MlpBlockParams params;
  BlockParams ref;
  RandomParams(c, &rng, &params, &ref);
  MlpBlock block(c);
  Tensor y;
  MlpBlockSaved saved;
  const absl::Status bad_x =
      block.Forward(params, Tensor::Zeros(DType::kFloat32, {2, 5}), &y, &saved);
  EXPECT_EQ(bad_x.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_x.message().find("block input x"), std::string::npos) << bad_x;
  EXPECT_NE(bad_x.message().find("[2, 4]"), std::string::npos) << bad_x;

  MlpBlockParams bad = params;
  bad.fc2_weight = Tensor::Zeros(DType::kFloat32, {4, 7});
  const absl::Status bad_w =
      block.Forward(bad, Tensor::Zeros(DType::kFloat32, {2, 4}), &y, &saved);
  EXPECT_EQ(bad_w.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_w.message().find("fc2.weight"), std::string::npos) << bad_w;

  MlpBlockParams no_bias = params;
  no_bias.fc1_bias = Tensor();
  EXPECT_NE(
      block.Forward(no_bias, Tensor::Zeros(DType::kFloat32, {2, 4}), &y, &saved)
          .message()
          .find("fc1.bias"),
      std::string::npos);

  MlpBlockSaved empty;
  MlpBlockParams grads;
  EXPECT_EQ(block.BackwardWeight(&empty, false, &grads).code(),
            absl::StatusCode::kFailedPrecondition);
  Tensor dx;
  EXPECT_EQ(block
                .BackwardInput(params, Tensor::Zeros(DType::kFloat32, {2, 4}),
                               &empty, &dx)
                .code(),
            absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(
      block.Forward(params, Tensor::Zeros(DType::kFloat32, {2, 4}), &y, &saved)
          .ok());
  const absl::Status bad_dy = block.BackwardInput(
      params, Tensor::Zeros(DType::kFloat32, {3, 4}), &saved, &dx);
  EXPECT_NE(bad_dy.message().find("d_out"), std::string::npos) << bad_dy;

  MlpBlockConfig res = c;
  res.residual = true;
  res.out_features = 5;
  const absl::Status bad_res = MlpBlock(res).Forward(
      params, Tensor::Zeros(DType::kFloat32, {2, 4}), &y, &saved);
  EXPECT_EQ(bad_res.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_res.message().find("residual"), std::string::npos) << bad_res;
}

}  // namespace
}  // namespace trainyard
