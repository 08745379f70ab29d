#include "kernels/cuda/cuda_mlp_block.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/cuda/norm_kernels.h"

namespace trainyard {
namespace gpu {
namespace {

absl::Status Need(const char* name, const void* p) {
  if (p == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaMlpBlock: ", name, " is null"));
  }
  return absl::OkStatus();
}

absl::Status CheckParams(const MlpBlockConfig& c, const CudaMlpBlockParams& p) {
  if (c.norm != NormType::kNone)
    RETURN_IF_ERROR(Need("norm.weight", p.norm_weight));
  if (c.norm == NormType::kLayerNorm)
    RETURN_IF_ERROR(Need("norm.bias", p.norm_bias));
  RETURN_IF_ERROR(Need("fc1.weight", p.fc1_weight));
  RETURN_IF_ERROR(Need("fc2.weight", p.fc2_weight));
  if (c.bias) {
    RETURN_IF_ERROR(Need("fc1.bias", p.fc1_bias));
    RETURN_IF_ERROR(Need("fc2.bias", p.fc2_bias));
  }
  return absl::OkStatus();
}

absl::Status CheckGrads(const MlpBlockConfig& c, const CudaMlpBlockGrads& g) {
  RETURN_IF_ERROR(Need("grad fc1.weight", g.fc1_weight));
  RETURN_IF_ERROR(Need("grad fc2.weight", g.fc2_weight));
  if (c.bias) {
    RETURN_IF_ERROR(Need("grad fc1.bias", g.fc1_bias));
    RETURN_IF_ERROR(Need("grad fc2.bias", g.fc2_bias));
  }
  if (c.norm != NormType::kNone)
    RETURN_IF_ERROR(Need("grad norm.weight", g.norm_weight));
  if (c.norm == NormType::kLayerNorm)
    RETURN_IF_ERROR(Need("grad norm.bias", g.norm_bias));
  return absl::OkStatus();
}

// The block's GEMMs that have a fused-epilogue form.
enum Site : int {
  kFc1Forward = 0,   // fc1 + bias + gelu_tanh / relu
  kFc2Forward = 1,   // fc2 + bias (+ residual as C)
  kFc1Backward = 2,  // d_act GEMM + dgelu_tanh / drelu (+ fc1 bias grad)
  kFc2WeightGrad = 3,
  kFc1WeightGrad = 4,
};

const char* SiteName(int site) {
  switch (site) {
    case kFc1Forward:
      return "fc1 forward";
    case kFc2Forward:
      return "fc2 forward";
    case kFc1Backward:
      return "fc1 backward";
    case kFc2WeightGrad:
      return "fc2 weight gradient";
    case kFc1WeightGrad:
      return "fc1 weight gradient";
  }
  return "?";
}

int64_t RoundUp(int64_t x, int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaMlpBlock>> CudaMlpBlock::Create(
    const MlpBlockConfig& config, ComputeMode mode, int device) {
  RETURN_IF_ERROR(ValidateBlockConfig(config));
  ASSIGN_OR_RETURN(std::unique_ptr<GemmLt> gemm, GemmLt::Create(device));
  return std::unique_ptr<CudaMlpBlock>(
      new CudaMlpBlock(config, mode, device, std::move(gemm)));
}

absl::StatusOr<DeviceBuffer> CudaMlpBlock::Alloc(int64_t elements, DType t) {
  return DeviceBuffer::Allocate(device_, elements * DTypeSize(t));
}

GemmArgs CudaMlpBlock::Args(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                            const void* a, int64_t lda, const void* b,
                            int64_t ldb, float beta, const void* c, void* d,
                            int64_t ldd, DType d_type) const {
  GemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.precision = mode_ == ComputeMode::kFloat32 ? GemmPrecision::kFloat32
                : mode_ == ComputeMode::kTf32  ? GemmPrecision::kTf32
                                               : GemmPrecision::kBFloat16;
  g.a = a;
  g.lda = lda;
  g.b = b;
  g.ldb = ldb;
  g.beta = beta;
  g.c = c;
  g.ldc = ldd;
  g.d = d;
  g.ldd = ldd;
  g.d_type = d_type;
  return g;
}

absl::Status CudaMlpBlock::RunGemm(const GemmArgs& g, Stream stream) {
  if (g.m == 0 || g.n == 0) return absl::OkStatus();
  if (g.k == 0) {  // empty reduction: D = beta * C
    const size_t bytes = g.m * g.n * DTypeSize(g.d_type);
    if (g.beta == 0.0f) return MemsetAsync(g.d, 0, bytes, stream);
    if (g.c != g.d) return CopyDeviceToDevice(g.d, g.c, bytes, stream);
    return absl::OkStatus();
  }
  return gemm_->Run(g, stream);
}

bool CudaMlpBlock::MayFuse(int site, int64_t rows) const {
  if (!use_epilogues_ || rows == 0) return false;
  auto it = decisions_.find(std::make_pair(site, rows));
  return it == decisions_.end() || it->second.fused;
}

absl::StatusOr<bool> CudaMlpBlock::RunFused(int site, int64_t rows,
                                            const GemmArgs& g, Stream stream) {
  absl::Status s = gemm_->Run(g, stream);
  EpilogueDecision& d = decisions_[std::make_pair(site, rows)];
  if (s.ok()) {
    d.fused = true;
    d.what = GemmEpilogueName(g.epilogue);
    ++stats_.fused_gemms;
    return true;
  }
  if (s.code() != absl::StatusCode::kUnimplemented) return s;
  d.fused = false;
  d.what = absl::StrCat("element-wise (", s.message(), ")");
  ++stats_.fallbacks;
  return false;
}

std::string CudaMlpBlock::EpilogueReport() const {
  std::vector<std::pair<std::pair<int, int64_t>, std::string>> lines;
  for (const auto& [key, d] : decisions_) lines.emplace_back(key, d.what);
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const auto& [key, what] : lines) {
    absl::StrAppend(&out, SiteName(key.first), ", ", key.second,
                    " rows: ", what, "\n");
  }
  return out;
}

absl::Status CudaMlpBlock::FoldBiasGrad(const float* src, int64_t n,
                                        bool accumulate, float* dst,
                                        Stream stream) {
  if (accumulate) {
    return AddBiasResidual(DType::kFloat32, 1, n, nullptr, src, dst, stream);
  }
  return CopyDeviceToDevice(dst, src, n * sizeof(float), stream);
}

absl::Status CudaMlpBlock::Bf16Weights(const CudaMlpBlockParams& p,
                                       const void** w1, const void** w2,
                                       Stream stream) {
  const MlpBlockConfig& c = config_;
  const int64_t n1 = c.fc1_out() * c.in_features;
  const int64_t n2 = c.out_features * c.ffn_hidden_size;
  if (p.fc1_weight_bf16 != nullptr) {
    *w1 = p.fc1_weight_bf16;
  } else {
    if (w1_bf16_.empty()) {
      ASSIGN_OR_RETURN(w1_bf16_, Alloc(n1, DType::kBFloat16));
    }
    RETURN_IF_ERROR(CastFloatToBf16(n1, p.fc1_weight, w1_bf16_.data(), stream));
    *w1 = w1_bf16_.data();
  }
  if (p.fc2_weight_bf16 != nullptr) {
    *w2 = p.fc2_weight_bf16;
  } else {
    if (w2_bf16_.empty()) {
      ASSIGN_OR_RETURN(w2_bf16_, Alloc(n2, DType::kBFloat16));
    }
    RETURN_IF_ERROR(CastFloatToBf16(n2, p.fc2_weight, w2_bf16_.data(), stream));
    *w2 = w2_bf16_.data();
  }
  return absl::OkStatus();
}

absl::Status CudaMlpBlock::Forward(const CudaMlpBlockParams& p, int64_t rows,
                                   const void* x, void* y,
                                   CudaMlpBlockSaved* saved, Stream stream) {
  RETURN_IF_ERROR(CheckParams(config_, p));
  if (rows < 0) return absl::InvalidArgumentError("CudaMlpBlock: rows < 0");
  if (rows > 0) {
    RETURN_IF_ERROR(Need("block input x", x));
    RETURN_IF_ERROR(Need("block output y", y));
  }
  const void* w1 = p.fc1_weight;
  const void* w2 = p.fc2_weight;
  if (mode_ == ComputeMode::kBFloat16)
    RETURN_IF_ERROR(Bf16Weights(p, &w1, &w2, stream));

  CudaMlpBlockSaved s;
  s.rows = rows;
  s.x = x;
  s.norm_out = x;
  RETURN_IF_ERROR(NormForward(p, &s, stream));
  RETURN_IF_ERROR(Fc1Forward(p, w1, &s, stream));
  RETURN_IF_ERROR(Fc2Forward(p, w2, s, y, stream));
  *saved = std::move(s);
  return absl::OkStatus();
}

absl::Status CudaMlpBlock::NormForward(const CudaMlpBlockParams& p,
                                       CudaMlpBlockSaved* s, Stream stream) {
  const MlpBlockConfig& c = config_;
  if (c.norm == NormType::kNone) return absl::OkStatus();
  const DType t = activation_type();
  const int64_t b = s->rows, in = c.in_features;
  ASSIGN_OR_RETURN(s->norm_out_buf, Alloc(b * in, t));
  ASSIGN_OR_RETURN(s->rstd, Alloc(b, DType::kFloat32));
  s->norm_out = s->norm_out_buf.data();
  if (c.norm == NormType::kLayerNorm) {
    ASSIGN_OR_RETURN(s->mean, Alloc(b, DType::kFloat32));
    return LayerNormForward(t, b, in, s->x, p.norm_weight, p.norm_bias,
                            c.norm_eps, s->norm_out_buf.data(),
                            s->mean.as<float>(), s->rstd.as<float>(), stream);
  }
  return RmsNormForward(t, b, in, s->x, p.norm_weight, c.norm_eps,
                        s->norm_out_buf.data(), s->rstd.as<float>(), stream);
}

absl::Status CudaMlpBlock::Fc1Forward(const CudaMlpBlockParams& p,
                                      const void* w1, CudaMlpBlockSaved* s,
                                      Stream stream) {
  const MlpBlockConfig& c = config_;
  const DType t = activation_type();
  const int64_t b = s->rows, in = c.in_features, ffn = c.ffn_hidden_size,
                f1 = c.fc1_out();
  // fc1: [b, f1] = norm_out [b, in] @ fc1.weight^T (+ bias), then act.
  ASSIGN_OR_RETURN(s->act_out, Alloc(b * ffn, t));
  const float* b1 = c.bias ? p.fc1_bias : nullptr;
  const bool relu = c.activation == Activation::kRelu;
  bool fused = false;
  if ((relu || (c.activation == Activation::kGeluTanh && !exact_fp32())) &&
      MayFuse(kFc1Forward, b)) {
    ASSIGN_OR_RETURN(fused, FusedFc1Forward(b1, w1, s, stream));
  }
  if (fused) return absl::OkStatus();
  ASSIGN_OR_RETURN(s->fc1_out, Alloc(b * f1, t));
  RETURN_IF_ERROR(RunGemm(Args(false, true, b, f1, in, s->norm_out, in, w1, in,
                               0.0f, nullptr, s->fc1_out.data(), f1, t),
                          stream));
  if (c.activation == Activation::kSwiglu) {
    return BiasSwigluForward(t, b, ffn, b1, s->fc1_out.data(),
                             s->act_out.data(), stream);
  }
  return BiasActivationForward(c.activation, t, b, ffn, b1, s->fc1_out.data(),
                               s->act_out.data(), stream);
}

absl::StatusOr<bool> CudaMlpBlock::FusedFc1Forward(const float* b1,
                                                   const void* w1,
                                                   CudaMlpBlockSaved* s,
                                                   Stream stream) {
  const MlpBlockConfig& c = config_;
  const DType t = activation_type();
  const int64_t b = s->rows, in = c.in_features, ffn = c.ffn_hidden_size;
  const bool relu = c.activation == Activation::kRelu;
  // D = act_out directly; aux keeps what the backward needs: the relu
  // bitmask, or the gelu_tanh pre-activation (f1 == ffn here).
  GemmArgs g = Args(false, true, b, ffn, in, s->norm_out, in, w1, in, 0.0f,
                    nullptr, s->act_out.data(), ffn, t);
  g.bias = b1;
  DeviceBuffer aux;
  if (relu) {
    g.ld_aux = RoundUp(ffn, 128);  // bits
    ASSIGN_OR_RETURN(aux, DeviceBuffer::Allocate(device_, b * g.ld_aux / 8));
    g.epilogue = c.bias ? GemmEpilogue::kReluAuxBias : GemmEpilogue::kReluAux;
  } else {
    g.ld_aux = ffn;
    ASSIGN_OR_RETURN(aux, Alloc(b * ffn, t));
    g.epilogue =
        c.bias ? GemmEpilogue::kGeluTanhAuxBias : GemmEpilogue::kGeluTanhAux;
  }
  g.aux = aux.data();
  ASSIGN_OR_RETURN(const bool fused, RunFused(kFc1Forward, b, g, stream));
  if (fused && relu) {
    s->relu_mask = std::move(aux);
    s->relu_mask_ld = g.ld_aux;
  } else if (fused) {
    s->fc1_out = std::move(aux);
  }
  return fused;
}

absl::Status CudaMlpBlock::Fc2Forward(const CudaMlpBlockParams& p,
                                      const void* w2,
                                      const CudaMlpBlockSaved& s, void* y,
                                      Stream stream) {
  const MlpBlockConfig& c = config_;
  const DType t = activation_type();
  const int64_t b = s.rows, out = c.out_features, ffn = c.ffn_hidden_size;
  // fc2: y [b, out] = act_out @ fc2.weight^T (+ x as C) (+ bias).
  GemmArgs g2 =
      Args(false, true, b, out, ffn, s.act_out.data(), ffn, w2, ffn,
           c.residual ? 1.0f : 0.0f, c.residual ? s.x : nullptr, y, out, t);
  bool fused = false;
  if (c.bias && MayFuse(kFc2Forward, b)) {
    GemmArgs with_bias = g2;
    with_bias.epilogue = GemmEpilogue::kBias;
    with_bias.bias = p.fc2_bias;
    ASSIGN_OR_RETURN(fused, RunFused(kFc2Forward, b, with_bias, stream));
  }
  if (fused) return absl::OkStatus();
  RETURN_IF_ERROR(RunGemm(g2, stream));
  if (!c.bias) return absl::OkStatus();
  return AddBiasResidual(t, b, out, p.fc2_bias, nullptr, y, stream);
}

absl::Status CudaMlpBlock::BackwardInput(const CudaMlpBlockParams& p,
                                         const void* d_out,
                                         CudaMlpBlockSaved* saved, void* dx,
                                         Stream stream) {
  RETURN_IF_ERROR(CheckParams(config_, p));
  if (saved->act_out.empty() && saved->rows > 0) {
    return absl::FailedPreconditionError(
        "CudaMlpBlock::BackwardInput: saved tensors are empty (Forward not "
        "run, or BackwardWeight already released them)");
  }
  if (saved->rows > 0) {
    RETURN_IF_ERROR(Need("block output gradient d_out", d_out));
  }
  const void* w1 = p.fc1_weight;
  const void* w2 = p.fc2_weight;
  if (mode_ == ComputeMode::kBFloat16)
    RETURN_IF_ERROR(Bf16Weights(p, &w1, &w2, stream));
  RETURN_IF_ERROR(Fc1Backward(w2, d_out, saved, stream));
  saved->d_out = d_out;
  saved->has_grads = true;
  return NormBackwardInput(p, w1, saved, dx, stream);
}

absl::Status CudaMlpBlock::Fc1Backward(const void* w2, const void* d_out,
                                       CudaMlpBlockSaved* saved,
                                       Stream stream) {
  const MlpBlockConfig& c = config_;
  const DType t = activation_type();
  const int64_t b = saved->rows, out = c.out_features, ffn = c.ffn_hidden_size;
  // d_act [b, ffn] = d_out [b, out] @ fc2.weight [out, ffn]; then
  // d_fc1 [b, f1] = d_act * act'(pre).
  const GemmArgs g = Args(false, false, b, ffn, out, d_out, out, w2, ffn, 0.0f,
                          nullptr, nullptr, ffn, t);
  const bool relu = c.activation == Activation::kRelu;
  const bool gelu_tanh = c.activation == Activation::kGeluTanh && !exact_fp32();
  // The fused backward needs the forward's aux: the relu bitmask (only
  // there when the relu forward was fused) or the pre-activation.
  const bool have_aux = (relu && !saved->relu_mask.empty()) ||
                        (gelu_tanh && !saved->fc1_out.empty());
  bool fused = false;
  if (have_aux && MayFuse(kFc1Backward, b)) {
    ASSIGN_OR_RETURN(fused, FusedFc1Backward(g, saved, stream));
  }
  if (fused) return absl::OkStatus();
  ASSIGN_OR_RETURN(DeviceBuffer d_act, Alloc(b * ffn, t));
  GemmArgs ge = g;
  ge.d = d_act.data();
  RETURN_IF_ERROR(RunGemm(ge, stream));
  if (c.activation == Activation::kSwiglu) {
    ASSIGN_OR_RETURN(saved->d_fc1_out, Alloc(b * c.fc1_out(), t));
    return SwigluBackward(t, b, ffn, saved->fc1_out.data(), d_act.data(),
                          saved->d_fc1_out.data(), stream);
  }
  // A fused relu forward kept no pre-activation; relu'(x) is
  // [relu(x) > 0], so act_out serves.
  const void* pre =
      saved->fc1_out.empty() ? saved->act_out.data() : saved->fc1_out.data();
  RETURN_IF_ERROR(ActivationBackward(c.activation, t, b * ffn, pre,
                                     d_act.data(), d_act.data(), stream));
  saved->d_fc1_out = std::move(d_act);
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaMlpBlock::FusedFc1Backward(const GemmArgs& g,
                                                    CudaMlpBlockSaved* saved,
                                                    Stream stream) {
  const MlpBlockConfig& c = config_;
  const DType t = activation_type();
  const int64_t b = saved->rows, ffn = c.ffn_hidden_size;
  const bool relu = c.activation == Activation::kRelu;
  ASSIGN_OR_RETURN(DeviceBuffer d_fc1, Alloc(b * ffn, t));
  DeviceBuffer bias_grad;
  if (c.bias) {
    ASSIGN_OR_RETURN(bias_grad, Alloc(ffn, DType::kFloat32));
  }
  GemmArgs gf = g;
  gf.d = d_fc1.data();
  gf.aux = relu ? saved->relu_mask.data() : saved->fc1_out.data();
  gf.ld_aux = relu ? saved->relu_mask_ld : ffn;
  gf.epilogue =
      relu ? (c.bias ? GemmEpilogue::kDReluBiasGrad : GemmEpilogue::kDRelu)
           : (c.bias ? GemmEpilogue::kDGeluTanhBiasGrad
                     : GemmEpilogue::kDGeluTanh);
  gf.bias_grad = bias_grad.as<float>();
  ASSIGN_OR_RETURN(const bool fused, RunFused(kFc1Backward, b, gf, stream));
  if (fused) {
    saved->d_fc1_out = std::move(d_fc1);
    saved->d_fc1_bias = std::move(bias_grad);
  }
  return fused;
}

absl::Status CudaMlpBlock::NormBackwardInput(const CudaMlpBlockParams& p,
                                             const void* w1,
                                             CudaMlpBlockSaved* saved, void* dx,
                                             Stream stream) {
  const MlpBlockConfig& c = config_;
  const DType t = activation_type();
  const int64_t b = saved->rows, in = c.in_features, f1 = c.fc1_out();
  const void* d_out = saved->d_out;
  const bool need_d_norm_out = c.norm != NormType::kNone;
  if (!need_d_norm_out && dx == nullptr) return absl::OkStatus();
  // d_norm_out [b, in] = d_fc1 [b, f1] @ fc1.weight [f1, in].
  if (c.norm == NormType::kNone) {
    return RunGemm(
        Args(false, false, b, in, f1, saved->d_fc1_out.data(), f1, w1, in,
             c.residual ? 1.0f : 0.0f, c.residual ? d_out : nullptr, dx, in, t),
        stream);
  }
  ASSIGN_OR_RETURN(saved->d_norm_out, Alloc(b * in, t));
  RETURN_IF_ERROR(
      RunGemm(Args(false, false, b, in, f1, saved->d_fc1_out.data(), f1, w1, in,
                   0.0f, nullptr, saved->d_norm_out.data(), in, t),
              stream));
  if (dx == nullptr) return absl::OkStatus();
  const void* residual = c.residual ? d_out : nullptr;
  if (c.norm == NormType::kLayerNorm) {
    return LayerNormBackwardInput(
        t, b, in, saved->x, p.norm_weight, saved->mean.as<float>(),
        saved->rstd.as<float>(), saved->d_norm_out.data(), residual, dx,
        stream);
  }
  return RmsNormBackwardInput(t, b, in, saved->x, p.norm_weight,
                              saved->rstd.as<float>(), saved->d_norm_out.data(),
                              residual, dx, stream);
}

absl::Status CudaMlpBlock::BackwardWeight(CudaMlpBlockSaved* saved,
                                          bool accumulate,
                                          const CudaMlpBlockGrads& g,
                                          Stream stream) {
  const MlpBlockConfig& c = config_;
  if (!saved->has_grads) {
    return absl::FailedPreconditionError(
        "CudaMlpBlock::BackwardWeight: no gradients saved (BackwardInput not "
        "run for this microbatch, or BackwardWeight already ran)");
  }
  RETURN_IF_ERROR(CheckGrads(c, g));
  const DType t = activation_type();
  const int64_t b = saved->rows, out = c.out_features, f1 = c.fc1_out();
  if (c.bias && bias_grad_scratch_.empty()) {
    ASSIGN_OR_RETURN(bias_grad_scratch_,
                     Alloc(std::max(out, f1), DType::kFloat32));
  }
  ASSIGN_OR_RETURN(const bool fc2_bias_done,
                   Fc2WeightGrad(*saved, accumulate, g, stream));
  ASSIGN_OR_RETURN(const bool fc1_bias_done,
                   Fc1WeightGrad(*saved, accumulate, g, stream));
  if (c.bias && !fc2_bias_done) {
    RETURN_IF_ERROR(
        ColumnSums(t, b, out, saved->d_out, accumulate, g.fc2_bias, stream));
  }
  if (c.bias && !fc1_bias_done) {
    RETURN_IF_ERROR(ColumnSums(t, b, f1, saved->d_fc1_out.data(), accumulate,
                               g.fc1_bias, stream));
  }
  RETURN_IF_ERROR(NormParamGrads(*saved, accumulate, g, stream));
  *saved = CudaMlpBlockSaved();
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaMlpBlock::FusedWeightGrad(int site, int64_t rows,
                                                   const GemmArgs& g, int64_t n,
                                                   bool accumulate,
                                                   float* bias_grad,
                                                   Stream stream) {
  // The epilogue overwrites, so the bias gradient lands in the scratch and
  // is folded in.
  float* scratch = bias_grad_scratch_.as<float>();
  GemmArgs fused = g;
  fused.epilogue = GemmEpilogue::kBiasGradA;
  fused.bias_grad = scratch;
  ASSIGN_OR_RETURN(const bool ran, RunFused(site, rows, fused, stream));
  if (ran) {
    RETURN_IF_ERROR(FoldBiasGrad(scratch, n, accumulate, bias_grad, stream));
  }
  return ran;
}

absl::StatusOr<bool> CudaMlpBlock::Fc2WeightGrad(const CudaMlpBlockSaved& saved,
                                                 bool accumulate,
                                                 const CudaMlpBlockGrads& g,
                                                 Stream stream) {
  const MlpBlockConfig& c = config_;
  const int64_t b = saved.rows, out = c.out_features, ffn = c.ffn_hidden_size;
  // fc2.weight [out, ffn] (+)= d_out^T [out, b] @ act_out [b, ffn]; with
  // BGRADB its bias gradient (sum over rows of d_out) comes along.
  const GemmArgs g2 = Args(true, false, out, ffn, b, saved.d_out, out,
                           saved.act_out.data(), ffn, accumulate ? 1.0f : 0.0f,
                           g.fc2_weight, g.fc2_weight, ffn, DType::kFloat32);
  bool bias_done = false;
  if (c.bias && MayFuse(kFc2WeightGrad, b)) {
    ASSIGN_OR_RETURN(bias_done,
                     FusedWeightGrad(kFc2WeightGrad, b, g2, out, accumulate,
                                     g.fc2_bias, stream));
  }
  if (!bias_done) RETURN_IF_ERROR(RunGemm(g2, stream));
  return bias_done;
}

absl::StatusOr<bool> CudaMlpBlock::Fc1WeightGrad(const CudaMlpBlockSaved& saved,
                                                 bool accumulate,
                                                 const CudaMlpBlockGrads& g,
                                                 Stream stream) {
  const MlpBlockConfig& c = config_;
  const int64_t b = saved.rows, in = c.in_features, f1 = c.fc1_out();
  // fc1.weight [f1, in] (+)= d_fc1^T [f1, b] @ norm_out [b, in]. fc1's bias
  // gradient: from BackwardInput's fused epilogue, else BGRADB here.
  const GemmArgs g1 = Args(true, false, f1, in, b, saved.d_fc1_out.data(), f1,
                           saved.norm_out, in, accumulate ? 1.0f : 0.0f,
                           g.fc1_weight, g.fc1_weight, in, DType::kFloat32);
  bool bias_done = false;
  if (c.bias && !saved.d_fc1_bias.empty()) {
    RETURN_IF_ERROR(FoldBiasGrad(saved.d_fc1_bias.as<float>(), f1, accumulate,
                                 g.fc1_bias, stream));
    bias_done = true;
  }
  bool fused = false;
  if (c.bias && !bias_done && MayFuse(kFc1WeightGrad, b)) {
    ASSIGN_OR_RETURN(fused, FusedWeightGrad(kFc1WeightGrad, b, g1, f1,
                                            accumulate, g.fc1_bias, stream));
    bias_done = fused;
  }
  if (!fused) RETURN_IF_ERROR(RunGemm(g1, stream));
  return bias_done;
}

absl::Status CudaMlpBlock::NormParamGrads(const CudaMlpBlockSaved& saved,
                                          bool accumulate,
                                          const CudaMlpBlockGrads& g,
                                          Stream stream) {
  const MlpBlockConfig& c = config_;
  if (c.norm == NormType::kNone) return absl::OkStatus();
  const DType t = activation_type();
  const int64_t b = saved.rows, in = c.in_features;
  const size_t need = NormParamsWorkspaceBytes(b, in);
  if (norm_workspace_.size() < need) {
    ASSIGN_OR_RETURN(norm_workspace_, DeviceBuffer::Allocate(device_, need));
  }
  if (c.norm == NormType::kLayerNorm) {
    return LayerNormBackwardParams(
        t, b, in, saved.x, saved.mean.as<float>(), saved.rstd.as<float>(),
        saved.d_norm_out.data(), accumulate, g.norm_weight, g.norm_bias,
        norm_workspace_.data(), stream);
  }
  return RmsNormBackwardParams(t, b, in, saved.x, saved.rstd.as<float>(),
                               saved.d_norm_out.data(), accumulate,
                               g.norm_weight, norm_workspace_.data(), stream);
}

}  // namespace gpu
}  // namespace trainyard
