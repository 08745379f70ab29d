#include "kernels/mlp_block.h"

#include <atomic>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/activation.h"
#include "kernels/blas.h"
#include "kernels/linear.h"
#include "kernels/norm.h"
#include "kernels/packed_gemm.h"
#include "kernels/parallel.h"

namespace trainyard {
namespace {

// OK if `t` is a defined float32 CPU tensor of shape `shape`.
absl::Status CheckTensor(const char* name, const Tensor& t,
                         const Shape& shape) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": undefined, expected float32 ", ShapeToString(shape)));
  }
  if (t.dtype() != DType::kFloat32 || !t.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected float32 on cpu, got ",
                     DTypeName(t.dtype()), " on ", t.device().ToString()));
  }
  if (t.shape() != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected shape ", ShapeToString(shape), ", got ",
                     ShapeToString(t.shape())));
  }
  return absl::OkStatus();
}

// Checks the parameters Forward/BackwardInput read.
absl::Status CheckParams(const MlpBlockConfig& c, const MlpBlockParams& p) {
  if (c.norm != NormType::kNone) {
    RETURN_IF_ERROR(CheckTensor("norm.weight", p.norm_weight, {c.in_features}));
  }
  if (c.norm == NormType::kLayerNorm) {
    RETURN_IF_ERROR(CheckTensor("norm.bias", p.norm_bias, {c.in_features}));
  }
  RETURN_IF_ERROR(
      CheckTensor("fc1.weight", p.fc1_weight, {c.fc1_out(), c.in_features}));
  RETURN_IF_ERROR(CheckTensor("fc2.weight", p.fc2_weight,
                              {c.out_features, c.ffn_hidden_size}));
  if (c.bias) {
    RETURN_IF_ERROR(CheckTensor("fc1.bias", p.fc1_bias, {c.fc1_out()}));
    RETURN_IF_ERROR(CheckTensor("fc2.bias", p.fc2_bias, {c.out_features}));
  }
  return absl::OkStatus();
}

float* F(Tensor& t) { return t.data<float>(); }
const float* F(const Tensor& t) { return t.data<float>(); }
const float* OrNull(bool use, const Tensor& t) {
  return use ? t.data<float>() : nullptr;
}

// MlpWeightGemm's reads of a ready pack (KeptPackReadsForTesting).
std::atomic<int64_t> kept_pack_reads{0};

}  // namespace

int64_t KeptPackReadsForTesting() {
  return kept_pack_reads.load(std::memory_order_relaxed);
}

absl::Status MlpWeightGemm(const char* name, bool transposed, int64_t b,
                           int64_t n, int64_t k, const float* x, const float* w,
                           MlpBlockPacked::Weight* slot, float* out,
                           const GemmEpilogue& epilogue) {
  const int64_t ldw = transposed ? k : n;
  if (!UsePackedGemm(b)) {
    return Sgemm(false, transposed, b, n, k, 1.0f, x, k, w, ldw, 0.0f, out, n,
                 epilogue);
  }
  if (slot == nullptr || !slot->ready) {
    // Only the forward's orientation is kept.
    PackedMatrix* keep =
        transposed && slot != nullptr ? &slot->matrix : nullptr;
    RETURN_IF_ERROR(SgemmPacking(b, n, k, x, k, transposed, w, ldw, false, out,
                                 n, epilogue, keep));
    if (keep != nullptr) slot->ready = true;
    return absl::OkStatus();
  }
  kept_pack_reads.fetch_add(1, std::memory_order_relaxed);
  // The pack is W^T: [k, n] for the forward, [n, k] for the input gradient.
  const PackedMatrix& packed = slot->matrix;
  const int64_t pack_k = transposed ? k : n, pack_n = transposed ? n : k;
  if (packed.k() != pack_k || packed.n() != pack_n) {
    return absl::FailedPreconditionError(
        absl::StrCat("packed ", name, " holds [", packed.k(), ", ", packed.n(),
                     "], the GEMM needs [", pack_k, ", ", pack_n,
                     "] (packed for another block?)"));
  }
  if (!transposed) {
    return SgemmPackedTransposed(b, x, k, packed, false, out, n, epilogue);
  }
  return SgemmPacked(b, x, k, packed, false, out, n, epilogue);
}

std::vector<Tensor*> MlpBlockParams::InOrder(const MlpBlockConfig& c) {
  std::vector<Tensor*> out;
  if (c.norm != NormType::kNone) out.push_back(&norm_weight);
  if (c.norm == NormType::kLayerNorm) out.push_back(&norm_bias);
  out.push_back(&fc1_weight);
  if (c.bias) out.push_back(&fc1_bias);
  out.push_back(&fc2_weight);
  if (c.bias) out.push_back(&fc2_bias);
  return out;
}

namespace {

// norm_out [b, in] = norm(x), with the statistics the backward needs.
void NormForward(const MlpBlockConfig& c, const MlpBlockParams& params,
                 const Tensor& x, MlpBlockSaved* s) {
  const int64_t b = x.dim(0), in = c.in_features;
  switch (c.norm) {
    case NormType::kNone:
      s->norm_out = x;
      break;
    case NormType::kLayerNorm:
      s->norm_out = Tensor::Empty(DType::kFloat32, {b, in});
      s->mean = Tensor::Empty(DType::kFloat32, {b});
      s->rstd = Tensor::Empty(DType::kFloat32, {b});
      ParallelRows(b, in, [&](int64_t r, int64_t n) {
        LayerNormForward(n, in, F(x) + r * in, F(params.norm_weight),
                         F(params.norm_bias), c.norm_eps,
                         F(s->norm_out) + r * in, F(s->mean) + r,
                         F(s->rstd) + r);
      });
      break;
    case NormType::kRmsNorm:
      s->norm_out = Tensor::Empty(DType::kFloat32, {b, in});
      s->rstd = Tensor::Empty(DType::kFloat32, {b});
      ParallelRows(b, in, [&](int64_t r, int64_t n) {
        RmsNormForward(n, in, F(x) + r * in, F(params.norm_weight), c.norm_eps,
                       F(s->norm_out) + r * in, F(s->rstd) + r);
      });
      break;
  }
}

// fc1's epilogue: act_out = act(fc1_out (+ bias)) on a block of fc1_out,
// the bias added into fc1_out. Null for SwiGLU, whose outputs need both
// halves of a row (SwigluForwardOverRows).
GemmEpilogue ActivationEpilogue(const MlpBlockConfig& c,
                                const MlpBlockParams& params,
                                MlpBlockSaved* s) {
  // The kernels are called by name, never through pointers: taking an
  // ifunc's address (TY_VECTOR_CLONES) would export it from a task plugin
  // that links this block.
  const Activation act = c.activation;
  if (act == Activation::kSwiglu) return GemmEpilogue();
  const int64_t ffn = c.ffn_hidden_size;
  const float* b1 = OrNull(c.bias, params.fc1_bias);
  float* pre = F(s->fc1_out);
  float* out = F(s->act_out);
  return [=](int64_t row, int64_t rows, int64_t col, int64_t cols) {
    const float* bias = b1 == nullptr ? nullptr : b1 + col;
    for (int64_t r = row; r < row + rows; ++r) {
      float* p = pre + r * ffn + col;
      float* o = out + r * ffn + col;
      switch (act) {
        case Activation::kRelu:
          BiasReluForward(1, cols, bias, p, o);
          break;
        case Activation::kGelu:
          BiasGeluForward(1, cols, bias, p, o);
          break;
        case Activation::kGeluTanh:
          BiasGeluTanhForward(1, cols, bias, p, o);
          break;
        case Activation::kSwiglu:
          break;
      }
    }
  };
}

// The SwiGLU forward after fc1's GEMM, threaded over rows.
void SwigluForwardOverRows(const MlpBlockConfig& c,
                           const MlpBlockParams& params, int64_t b,
                           MlpBlockSaved* s) {
  const int64_t ffn = c.ffn_hidden_size;
  const float* b1 = OrNull(c.bias, params.fc1_bias);
  ParallelRows(b, 2 * ffn, [&](int64_t r, int64_t n) {
    BiasSwigluForward(n, ffn, b1, F(s->fc1_out) + r * 2 * ffn,
                      F(s->act_out) + r * ffn);
  });
}

// An epilogue adding bias [cols of C] (may be null) and residual (a
// matrix shaped like C, may be null) to a block of C [*, ld].
GemmEpilogue BiasResidualEpilogue(const float* bias, const float* residual,
                                  float* y, int64_t ld) {
  if (bias == nullptr && residual == nullptr) return GemmEpilogue();
  return [=](int64_t row, int64_t rows, int64_t col, int64_t cols) {
    for (int64_t r = row; r < row + rows; ++r) {
      AddBiasResidual(1, cols, bias == nullptr ? nullptr : bias + col,
                      residual == nullptr ? nullptr : residual + r * ld + col,
                      y + r * ld + col);
    }
  };
}

// The d(act_out) GEMM's epilogue: d_act [b, ffn] becomes d(fc1_out), in
// place, on each block, for the element-wise activations. Null for SwiGLU
// (SwigluBackwardOverRows).
GemmEpilogue ActivationBackwardEpilogue(const MlpBlockConfig& c,
                                        const Tensor& fc1_out, Tensor& d_act) {
  const Activation act = c.activation;
  if (act == Activation::kSwiglu) return GemmEpilogue();
  const int64_t ffn = c.ffn_hidden_size;
  const float* pre = F(fc1_out);
  float* grad = F(d_act);
  return [=](int64_t row, int64_t rows, int64_t col, int64_t cols) {
    for (int64_t r = row; r < row + rows; ++r) {
      const float* p = pre + r * ffn + col;
      float* g = grad + r * ffn + col;
      switch (act) {
        case Activation::kRelu:
          ReluBackward(cols, p, g);
          break;
        case Activation::kGelu:
          GeluBackward(cols, p, g);
          break;
        case Activation::kGeluTanh:
          GeluTanhBackward(cols, p, g);
          break;
        case Activation::kSwiglu:
          break;
      }
    }
  };
}

// d(fc1_out) [b, 2*ffn] from d(act_out) [b, ffn] for SwiGLU, threaded over
// rows.
Tensor SwigluBackwardOverRows(const MlpBlockConfig& c, int64_t b,
                              const Tensor& fc1_out, const Tensor& d_act) {
  const int64_t ffn = c.ffn_hidden_size;
  Tensor d_fc1 = Tensor::Empty(DType::kFloat32, {b, c.fc1_out()});
  ParallelRows(b, 2 * ffn, [&](int64_t r, int64_t n) {
    SwigluBackward(n, ffn, F(fc1_out) + r * 2 * ffn, F(d_act) + r * ffn,
                   F(d_fc1) + r * 2 * ffn);
  });
  return d_fc1;
}

// dx [b, in] from d(norm_out) (plus the residual gradient d_out); keeps
// d_norm_out in `saved` when the norm has parameters. dx may be null then.
void NormBackwardInput(const MlpBlockConfig& c, const MlpBlockParams& params,
                       const Tensor& d_out, Tensor d_norm_out,
                       MlpBlockSaved* saved, Tensor* dx) {
  const int64_t b = d_norm_out.dim(0), in = c.in_features;
  const float* residual = c.residual ? F(d_out) : nullptr;
  switch (c.norm) {
    case NormType::kNone:
      // The residual was added by the GEMM's epilogue.
      *dx = d_norm_out;
      return;
    case NormType::kLayerNorm:
      saved->d_norm_out = d_norm_out;
      if (dx == nullptr) return;
      *dx = Tensor::Empty(DType::kFloat32, {b, in});
      ParallelRows(b, in, [&](int64_t r, int64_t n) {
        LayerNormBackwardInput(
            n, in, F(saved->x) + r * in, F(params.norm_weight),
            F(saved->mean) + r, F(saved->rstd) + r, F(d_norm_out) + r * in,
            residual == nullptr ? nullptr : residual + r * in, F(*dx) + r * in);
      });
      return;
    case NormType::kRmsNorm:
      saved->d_norm_out = d_norm_out;
      if (dx == nullptr) return;
      *dx = Tensor::Empty(DType::kFloat32, {b, in});
      ParallelRows(b, in, [&](int64_t r, int64_t n) {
        RmsNormBackwardInput(n, in, F(saved->x) + r * in, F(params.norm_weight),
                             F(saved->rstd) + r, F(d_norm_out) + r * in,
                             residual == nullptr ? nullptr : residual + r * in,
                             F(*dx) + r * in);
      });
      return;
  }
}

}  // namespace

absl::Status MlpBlock::Forward(const MlpBlockParams& params, const Tensor& x,
                               Tensor* y, MlpBlockSaved* saved) const {
  const MlpBlockConfig& c = config_;
  RETURN_IF_ERROR(ValidateBlockConfig(c));
  RETURN_IF_ERROR(CheckParams(c, params));
  if (x.ndim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("block input x: expected [batch, ", c.in_features,
                     "], got ", ShapeToString(x.shape())));
  }
  const int64_t b = x.dim(0);
  RETURN_IF_ERROR(CheckTensor("block input x", x, {b, c.in_features}));
  const int64_t in = c.in_features, out = c.out_features,
                ffn = c.ffn_hidden_size, f1 = c.fc1_out();

  MlpBlockSaved s;
  s.x = x;
  NormForward(c, params, x, &s);
  // fc1: [b, f1] = norm_out [b, in] @ fc1.weight^T [in, f1].
  // The bias and activation run on each block of fc1_out as the GEMM
  // finishes it.
  s.fc1_out = Tensor::Empty(DType::kFloat32, {b, f1});
  s.act_out = Tensor::Empty(DType::kFloat32, {b, ffn});
  MlpBlockPacked* packed = params.packed;
  RETURN_IF_ERROR(MlpWeightGemm("fc1.weight", true, b, f1, in, F(s.norm_out),
                                F(params.fc1_weight),
                                packed ? &packed->fc1 : nullptr, F(s.fc1_out),
                                ActivationEpilogue(c, params, &s)));
  if (c.activation == Activation::kSwiglu)
    SwigluForwardOverRows(c, params, b, &s);

  // fc2: [b, out] = act_out [b, ffn] @ fc2.weight^T [ffn, out], then + bias
  // (+ x) on each block.
  Tensor result = Tensor::Empty(DType::kFloat32, {b, out});
  RETURN_IF_ERROR(MlpWeightGemm(
      "fc2.weight", true, b, out, ffn, F(s.act_out), F(params.fc2_weight),
      packed ? &packed->fc2 : nullptr, F(result),
      BiasResidualEpilogue(OrNull(c.bias, params.fc2_bias),
                           c.residual ? F(x) : nullptr, F(result), out)));
  *y = std::move(result);
  *saved = std::move(s);
  return absl::OkStatus();
}

absl::Status MlpBlock::BackwardInput(const MlpBlockParams& params,
                                     const Tensor& d_out, MlpBlockSaved* saved,
                                     Tensor* dx) const {
  const MlpBlockConfig& c = config_;
  RETURN_IF_ERROR(ValidateBlockConfig(c));
  RETURN_IF_ERROR(CheckParams(c, params));
  if (!saved->fc1_out.defined() || !saved->act_out.defined()) {
    return absl::FailedPreconditionError(
        "MlpBlock::BackwardInput: saved tensors are empty (Forward not run, "
        "or the backward already ran)");
  }
  const int64_t b = saved->x.dim(0);
  const int64_t in = c.in_features, out = c.out_features,
                ffn = c.ffn_hidden_size, f1 = c.fc1_out();
  const Tensor g = d_out;  // keeps d_out alive if *dx aliases it
  RETURN_IF_ERROR(CheckTensor("block output gradient d_out", g, {b, out}));

  // d(act_out) [b, ffn] = d_out [b, out] @ fc2.weight [out, ffn]; each
  // block becomes d(fc1_out) as the GEMM finishes it (element-wise
  // activations), or after it (SwiGLU).
  Tensor d_act = Tensor::Empty(DType::kFloat32, {b, ffn});
  MlpBlockPacked* packed = params.packed;
  RETURN_IF_ERROR(MlpWeightGemm(
      "fc2.weight", false, b, ffn, out, F(g), F(params.fc2_weight),
      packed ? &packed->fc2 : nullptr, F(d_act),
      ActivationBackwardEpilogue(c, saved->fc1_out, d_act)));
  const Tensor d_fc1 = c.activation == Activation::kSwiglu
                           ? SwigluBackwardOverRows(c, b, saved->fc1_out, d_act)
                           : d_act;
  saved->d_out = g;
  saved->d_fc1_out = d_fc1;
  saved->fc1_out = Tensor();

  // d(norm_out) [b, in] = d_fc1 [b, f1] @ fc1.weight [f1, in]; without a
  // norm that is dx, and the residual's gradient is added on each block.
  const bool need_d_norm_out = c.norm != NormType::kNone;
  if (!need_d_norm_out && dx == nullptr) return absl::OkStatus();
  Tensor d_norm_out = Tensor::Empty(DType::kFloat32, {b, in});
  RETURN_IF_ERROR(MlpWeightGemm(
      "fc1.weight", false, b, in, f1, F(d_fc1), F(params.fc1_weight),
      packed ? &packed->fc1 : nullptr, F(d_norm_out),
      BiasResidualEpilogue(nullptr,
                           !need_d_norm_out && c.residual ? F(g) : nullptr,
                           F(d_norm_out), in)));
  NormBackwardInput(c, params, g, d_norm_out, saved, dx);
  return absl::OkStatus();
}

namespace {

// Checks a gradient buffer; allocates it when undefined and !accumulate.
absl::Status PrepareGrad(const char* name, bool accumulate, const Shape& shape,
                         Tensor* t) {
  if (!t->defined() && !accumulate) {
    *t = Tensor::Empty(DType::kFloat32, shape);
    return absl::OkStatus();
  }
  return CheckTensor(name, *t, shape);
}

}  // namespace

absl::Status MlpBlock::BackwardWeight(MlpBlockSaved* saved, bool accumulate,
                                      MlpBlockParams* grads) const {
  MlpBlockSaved* const one[] = {saved};
  return BackwardWeights(one, accumulate, grads);
}

namespace {

// One microbatch's bias and norm parameter gradients.
void SmallGradients(const MlpBlockConfig& c, const MlpBlockSaved& s,
                    bool accumulate, MlpBlockParams* grads) {
  const int64_t b = s.x.dim(0);
  const int64_t in = c.in_features, out = c.out_features, f1 = c.fc1_out();
  if (c.bias) {
    ColumnSums(b, out, F(s.d_out), accumulate, F(grads->fc2_bias));
    ColumnSums(b, f1, F(s.d_fc1_out), accumulate, F(grads->fc1_bias));
  }
  if (c.norm == NormType::kLayerNorm) {
    LayerNormBackwardParams(b, in, F(s.x), F(s.mean), F(s.rstd),
                            F(s.d_norm_out), accumulate, F(grads->norm_weight),
                            F(grads->norm_bias));
  } else if (c.norm == NormType::kRmsNorm) {
    RmsNormBackwardParams(b, in, F(s.x), F(s.rstd), F(s.d_norm_out), accumulate,
                          F(grads->norm_weight));
  }
}

}  // namespace

absl::Status MlpBlock::BackwardWeights(absl::Span<MlpBlockSaved* const> saved,
                                       bool accumulate,
                                       MlpBlockParams* grads) const {
  const MlpBlockConfig& c = config_;
  RETURN_IF_ERROR(ValidateBlockConfig(c));
  for (size_t i = 0; i < saved.size(); ++i) {
    if (!saved[i]->d_fc1_out.defined() || !saved[i]->d_out.defined()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "MlpBlock::BackwardWeight: no gradients saved for microbatch ", i,
          " of ", saved.size(),
          " (BackwardInput not run for it, or BackwardWeight already ran)"));
    }
  }
  if (saved.empty()) return absl::OkStatus();
  const int64_t in = c.in_features, out = c.out_features,
                ffn = c.ffn_hidden_size, f1 = c.fc1_out();
  if (c.norm != NormType::kNone) {
    RETURN_IF_ERROR(
        PrepareGrad("grad norm.weight", accumulate, {in}, &grads->norm_weight));
  }
  if (c.norm == NormType::kLayerNorm) {
    RETURN_IF_ERROR(
        PrepareGrad("grad norm.bias", accumulate, {in}, &grads->norm_bias));
  }
  RETURN_IF_ERROR(
      PrepareGrad("grad fc1.weight", accumulate, {f1, in}, &grads->fc1_weight));
  RETURN_IF_ERROR(PrepareGrad("grad fc2.weight", accumulate, {out, ffn},
                              &grads->fc2_weight));
  if (c.bias) {
    RETURN_IF_ERROR(
        PrepareGrad("grad fc1.bias", accumulate, {f1}, &grads->fc1_bias));
    RETURN_IF_ERROR(
        PrepareGrad("grad fc2.bias", accumulate, {out}, &grads->fc2_bias));
  }
  const auto rows = [&](size_t i) { return saved[i]->x.dim(0); };
  for (size_t i = 0; i < saved.size();) {
    // Microbatches [i, end): a run on the packed GEMM, or one on OpenBLAS.
    const bool packed = UsePackedGemm(rows(i));
    size_t end = i + 1;
    while (packed && end < saved.size() && UsePackedGemm(rows(end))) ++end;
    const bool acc = accumulate || i > 0;
    if (packed) {
      std::vector<GradientRows> fc2, fc1;
      for (size_t j = i; j < end; ++j) {
        const MlpBlockSaved& s = *saved[j];
        fc2.push_back({rows(j), F(s.d_out), out, F(s.act_out), ffn});
        fc1.push_back({rows(j), F(s.d_fc1_out), f1, F(s.norm_out), in});
      }
      // fc2.weight [out, ffn] (+)= d_out^T @ act_out, fc1.weight [f1, in]
      // (+)= d_fc1_out^T @ norm_out, over the run.
      RETURN_IF_ERROR(
          SgemmWeightGradient(out, ffn, fc2, acc, F(grads->fc2_weight), ffn));
      RETURN_IF_ERROR(
          SgemmWeightGradient(f1, in, fc1, acc, F(grads->fc1_weight), in));
    } else {
      const MlpBlockSaved& s = *saved[i];
      const float beta = acc ? 1.0f : 0.0f;
      RETURN_IF_ERROR(Sgemm(true, false, out, ffn, rows(i), 1.0f, F(s.d_out),
                            out, F(s.act_out), ffn, beta, F(grads->fc2_weight),
                            ffn));
      RETURN_IF_ERROR(Sgemm(true, false, f1, in, rows(i), 1.0f, F(s.d_fc1_out),
                            f1, F(s.norm_out), in, beta, F(grads->fc1_weight),
                            in));
    }
    for (size_t j = i; j < end; ++j) {
      SmallGradients(c, *saved[j], accumulate || j > 0, grads);
    }
    i = end;
  }
  for (MlpBlockSaved* s : saved) *s = MlpBlockSaved();
  return absl::OkStatus();
}

}  // namespace trainyard
