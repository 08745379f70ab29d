#include "kernels/cuda/cuda_mlp_block.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/cuda/norm_kernels.h"

namespace trainyard {
namespace gpu {
namespace {

absl::Status ValidateConfig(const MlpBlockConfig& c) {
  if (c.in_features <= 0 || c.out_features <= 0 || c.ffn_hidden_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaMlpBlock: in_features, out_features and ffn_hidden_size must be "
        "> 0, got ",
        c.in_features, ", ", c.out_features, ", ", c.ffn_hidden_size));
  }
  if (c.residual && c.in_features != c.out_features) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaMlpBlock: residual needs in_features == out_features, got ",
        c.in_features, " and ", c.out_features));
  }
  if (c.norm != NormType::kNone && !(c.norm_eps > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaMlpBlock: norm_eps must be > 0, got ", c.norm_eps));
  }
  return absl::OkStatus();
}

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

ActKind ToActKind(Activation a) {
  switch (a) {
    case Activation::kRelu:
      return ActKind::kRelu;
    case Activation::kGeluTanh:
      return ActKind::kGeluTanh;
    default:
      return ActKind::kGelu;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaMlpBlock>> CudaMlpBlock::Create(
    const MlpBlockConfig& config, ComputeMode mode, int device) {
  RETURN_IF_ERROR(ValidateConfig(config));
  ASSIGN_OR_RETURN(std::unique_ptr<GemmLt> gemm, GemmLt::Create(device));
  return std::unique_ptr<CudaMlpBlock>(
      new CudaMlpBlock(config, mode, device, std::move(gemm)));
}

absl::StatusOr<DeviceBuffer> CudaMlpBlock::Alloc(int64_t elements, DataType t) {
  return DeviceBuffer::Allocate(device_, elements * DataTypeSize(t));
}

absl::Status CudaMlpBlock::Gemm(bool ta, bool tb, int64_t m, int64_t n,
                                int64_t k, const void* a, int64_t lda,
                                const void* b, int64_t ldb, float beta,
                                const void* c, void* d, int64_t ldd,
                                DataType d_type, Stream stream) {
  if (m == 0 || n == 0) return absl::OkStatus();
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
  if (k == 0) {  // empty reduction: D = beta * C
    if (beta == 0.0f) {
      return MemsetAsync(d, 0, m * n * DataTypeSize(d_type), stream);
    }
    if (c != d) {
      return CopyDeviceToDevice(d, c, m * n * DataTypeSize(d_type), stream);
    }
    return absl::OkStatus();
  }
  return gemm_->Run(g, stream);
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
      ASSIGN_OR_RETURN(w1_bf16_, Alloc(n1, DataType::kBFloat16));
    }
    RETURN_IF_ERROR(CastFloatToBf16(n1, p.fc1_weight, w1_bf16_.data(), stream));
    *w1 = w1_bf16_.data();
  }
  if (p.fc2_weight_bf16 != nullptr) {
    *w2 = p.fc2_weight_bf16;
  } else {
    if (w2_bf16_.empty()) {
      ASSIGN_OR_RETURN(w2_bf16_, Alloc(n2, DataType::kBFloat16));
    }
    RETURN_IF_ERROR(CastFloatToBf16(n2, p.fc2_weight, w2_bf16_.data(), stream));
    *w2 = w2_bf16_.data();
  }
  return absl::OkStatus();
}

absl::Status CudaMlpBlock::Forward(const CudaMlpBlockParams& p, int64_t rows,
                                   const void* x, void* y,
                                   CudaMlpBlockSaved* saved, Stream stream) {
  const MlpBlockConfig& c = config_;
  RETURN_IF_ERROR(CheckParams(c, p));
  if (rows < 0) return absl::InvalidArgumentError("CudaMlpBlock: rows < 0");
  if (rows > 0) {
    RETURN_IF_ERROR(Need("block input x", x));
    RETURN_IF_ERROR(Need("block output y", y));
  }
  const DataType t = activation_type();
  const int64_t b = rows, in = c.in_features, out = c.out_features,
                ffn = c.ffn_hidden_size, f1 = c.fc1_out();
  const void* w1 = p.fc1_weight;
  const void* w2 = p.fc2_weight;
  if (mode_ == ComputeMode::kBFloat16)
    RETURN_IF_ERROR(Bf16Weights(p, &w1, &w2, stream));

  CudaMlpBlockSaved s;
  s.rows = b;
  s.x = x;
  s.norm_out = x;
  if (c.norm != NormType::kNone) {
    ASSIGN_OR_RETURN(s.norm_out_buf, Alloc(b * in, t));
    ASSIGN_OR_RETURN(s.rstd, Alloc(b, DataType::kFloat32));
    s.norm_out = s.norm_out_buf.data();
    if (c.norm == NormType::kLayerNorm) {
      ASSIGN_OR_RETURN(s.mean, Alloc(b, DataType::kFloat32));
      RETURN_IF_ERROR(LayerNormForward(t, b, in, x, p.norm_weight, p.norm_bias,
                                       c.norm_eps, s.norm_out_buf.data(),
                                       s.mean.as<float>(), s.rstd.as<float>(),
                                       stream));
    } else {
      RETURN_IF_ERROR(RmsNormForward(t, b, in, x, p.norm_weight, c.norm_eps,
                                     s.norm_out_buf.data(), s.rstd.as<float>(),
                                     stream));
    }
  }
  // fc1: [b, f1] = norm_out [b, in] @ fc1.weight^T.
  ASSIGN_OR_RETURN(s.fc1_out, Alloc(b * f1, t));
  ASSIGN_OR_RETURN(s.act_out, Alloc(b * ffn, t));
  RETURN_IF_ERROR(Gemm(false, true, b, f1, in, s.norm_out, in, w1, in, 0.0f,
                       nullptr, s.fc1_out.data(), f1, t, stream));
  const float* b1 = c.bias ? p.fc1_bias : nullptr;
  if (c.activation == Activation::kSwiglu) {
    RETURN_IF_ERROR(BiasSwigluForward(t, b, ffn, b1, s.fc1_out.data(),
                                      s.act_out.data(), stream));
  } else {
    RETURN_IF_ERROR(BiasActivationForward(ToActKind(c.activation), t, b, ffn,
                                          b1, s.fc1_out.data(),
                                          s.act_out.data(), stream));
  }
  // fc2: y [b, out] = act_out @ fc2.weight^T (+ x) (+ bias).
  RETURN_IF_ERROR(Gemm(false, true, b, out, ffn, s.act_out.data(), ffn, w2, ffn,
                       c.residual ? 1.0f : 0.0f, c.residual ? x : nullptr, y,
                       out, t, stream));
  if (c.bias) {
    RETURN_IF_ERROR(AddBiasResidual(t, b, out, p.fc2_bias, nullptr, y, stream));
  }
  *saved = std::move(s);
  return absl::OkStatus();
}

absl::Status CudaMlpBlock::BackwardInput(const CudaMlpBlockParams& p,
                                         const void* d_out,
                                         CudaMlpBlockSaved* saved, void* dx,
                                         Stream stream) {
  const MlpBlockConfig& c = config_;
  RETURN_IF_ERROR(CheckParams(c, p));
  if (saved->fc1_out.empty() && saved->rows > 0) {
    return absl::FailedPreconditionError(
        "CudaMlpBlock::BackwardInput: saved tensors are empty (Forward not "
        "run, or BackwardWeight already released them)");
  }
  const DataType t = activation_type();
  const int64_t b = saved->rows, in = c.in_features, out = c.out_features,
                ffn = c.ffn_hidden_size, f1 = c.fc1_out();
  if (b > 0) RETURN_IF_ERROR(Need("block output gradient d_out", d_out));
  const void* w1 = p.fc1_weight;
  const void* w2 = p.fc2_weight;
  if (mode_ == ComputeMode::kBFloat16)
    RETURN_IF_ERROR(Bf16Weights(p, &w1, &w2, stream));

  // d_act [b, ffn] = d_out [b, out] @ fc2.weight [out, ffn].
  ASSIGN_OR_RETURN(DeviceBuffer d_act, Alloc(b * ffn, t));
  RETURN_IF_ERROR(Gemm(false, false, b, ffn, out, d_out, out, w2, ffn, 0.0f,
                       nullptr, d_act.data(), ffn, t, stream));
  if (c.activation == Activation::kSwiglu) {
    ASSIGN_OR_RETURN(saved->d_fc1_out, Alloc(b * f1, t));
    RETURN_IF_ERROR(SwigluBackward(t, b, ffn, saved->fc1_out.data(),
                                   d_act.data(), saved->d_fc1_out.data(),
                                   stream));
  } else {
    RETURN_IF_ERROR(ActivationBackward(ToActKind(c.activation), t, b * ffn,
                                       saved->fc1_out.data(), d_act.data(),
                                       d_act.data(), stream));
    saved->d_fc1_out = std::move(d_act);
  }
  saved->d_out = d_out;
  saved->has_grads = true;
  const bool need_d_norm_out = c.norm != NormType::kNone;
  if (!need_d_norm_out && dx == nullptr) return absl::OkStatus();
  // d_norm_out [b, in] = d_fc1 [b, f1] @ fc1.weight [f1, in].
  if (c.norm == NormType::kNone) {
    return Gemm(false, false, b, in, f1, saved->d_fc1_out.data(), f1, w1, in,
                c.residual ? 1.0f : 0.0f, c.residual ? d_out : nullptr, dx, in,
                t, stream);
  }
  ASSIGN_OR_RETURN(saved->d_norm_out, Alloc(b * in, t));
  RETURN_IF_ERROR(Gemm(false, false, b, in, f1, saved->d_fc1_out.data(), f1, w1,
                       in, 0.0f, nullptr, saved->d_norm_out.data(), in, t,
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
  const DataType t = activation_type();
  const int64_t b = saved->rows, in = c.in_features, out = c.out_features,
                ffn = c.ffn_hidden_size, f1 = c.fc1_out();
  const float beta = accumulate ? 1.0f : 0.0f;
  // fc2.weight [out, ffn] (+)= d_out^T [out, b] @ act_out [b, ffn].
  RETURN_IF_ERROR(Gemm(true, false, out, ffn, b, saved->d_out, out,
                       saved->act_out.data(), ffn, beta, g.fc2_weight,
                       g.fc2_weight, ffn, DataType::kFloat32, stream));
  // fc1.weight [f1, in] (+)= d_fc1^T [f1, b] @ norm_out [b, in].
  RETURN_IF_ERROR(Gemm(true, false, f1, in, b, saved->d_fc1_out.data(), f1,
                       saved->norm_out, in, beta, g.fc1_weight, g.fc1_weight,
                       in, DataType::kFloat32, stream));
  if (c.bias) {
    RETURN_IF_ERROR(
        ColumnSums(t, b, out, saved->d_out, accumulate, g.fc2_bias, stream));
    RETURN_IF_ERROR(ColumnSums(t, b, f1, saved->d_fc1_out.data(), accumulate,
                               g.fc1_bias, stream));
  }
  if (c.norm == NormType::kLayerNorm) {
    RETURN_IF_ERROR(LayerNormBackwardParams(
        t, b, in, saved->x, saved->mean.as<float>(), saved->rstd.as<float>(),
        saved->d_norm_out.data(), accumulate, g.norm_weight, g.norm_bias,
        stream));
  } else if (c.norm == NormType::kRmsNorm) {
    RETURN_IF_ERROR(RmsNormBackwardParams(
        t, b, in, saved->x, saved->rstd.as<float>(), saved->d_norm_out.data(),
        accumulate, g.norm_weight, stream));
  }
  *saved = CudaMlpBlockSaved();
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace trainyard
