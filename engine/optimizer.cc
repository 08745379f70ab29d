#include "engine/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/step_totals.h"
#include "kernels/cuda/optimizer_kernels.h"
#include "kernels/parallel.h"

namespace trainyard {
namespace {

// Element-wise kernels. Plain loops the compiler vectorises; every clone
// computes bitwise the same results (IEEE add/mul/div/sqrt, no FMA
// contraction: see .bazelrc).
__attribute__((target_clones("avx512f", "avx2", "default"))) void AdamWKernel(
    int64_t n, float* __restrict p, const float* __restrict g_raw,
    float* __restrict m, float* __restrict v, float grad_scale, float decay,
    float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
    float bc2_sqrt, float eps, float neg_step_size) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = g_raw[i] * grad_scale;
    const float pi = p[i] * decay;
    const float mi = m[i] * beta1 + one_minus_beta1 * g;
    const float vi = v[i] * beta2 + (one_minus_beta2 * g) * g;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + (neg_step_size * mi) / denom;
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void SgdKernel(
    int64_t n, float* __restrict p, const float* __restrict g_raw,
    float* __restrict buf, float grad_scale, float weight_decay, float momentum,
    float one_minus_dampening, bool first, bool nesterov, float neg_lr) {
  for (int64_t i = 0; i < n; ++i) {
    float g = g_raw[i] * grad_scale;
    if (weight_decay != 0.0f) g = g + weight_decay * p[i];
    if (buf != nullptr) {
      const float b = first ? g : buf[i] * momentum + one_minus_dampening * g;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    p[i] = p[i] + neg_lr * g;
  }
}

// Elements per unit of parallel work: big enough to amortise scheduling,
// small enough to balance two to a few dozen threads.
constexpr int64_t kChunk = int64_t{1} << 16;

// SumOfSquares walks its range in blocks of kBlock elements and prefetches
// kAhead elements ahead: on its one stream the hardware prefetcher alone
// keeps too few cache misses in flight for one core to read at the memory
// bandwidth (docs/BENCHMARKS.md, "CPU optimizer vs. memory bandwidth"; the
// update kernels' three or four streams gained nothing from it).
// Prefetching changes no arithmetic.
constexpr int64_t kBlock = 64;
constexpr int64_t kAhead = 512;
constexpr int64_t kLine = 64 / sizeof(float);

// Prefetches the cache lines of x[begin, begin + kBlock) that lie in [0, n).
inline void PrefetchBlock(const float* x, int64_t begin, int64_t n) {
  for (int64_t i = begin; i < begin + kBlock && i < n; i += kLine) {
    __builtin_prefetch(x + i);
  }
}

// Sum of squares in double with a fixed lane structure, so the result does
// not depend on the compiler's vector width: lane j sums x[8k + j] in
// ascending k, the last n % 8 elements go to lane 0, then the lanes add up
// in order. The blocks (a multiple of 8 elements) only place the prefetches.
double SumOfSquares(const float* x, int64_t n) {
  static_assert(kBlock % 8 == 0, "blocks must keep the lanes' groups whole");
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n;) {
    PrefetchBlock(x, i + kAhead, n);
    const int64_t end = std::min(n, i + kBlock);
    for (; i + 8 <= end; i += 8) {
      for (int j = 0; j < 8; ++j) {
        const double v = x[i + j];
        lanes[j] += v * v;
      }
    }
  }
  for (; i < n; ++i) {
    const double v = x[i];
    lanes[0] += v * v;
  }
  double total = 0;
  for (double l : lanes) total += l;
  return total;
}

}  // namespace

absl::StatusOr<StageOptimizer> StageOptimizer::Create(
    const trainyard::v1::OptimizerSpec& spec,
    std::vector<ParamSegment> segments, int64_t total_size,
    const ExecContext* ctx) {
  StageOptimizer opt;
  opt.spec_ = spec;
  opt.ctx_ = ctx != nullptr && !ctx->device().is_cpu() ? ctx : nullptr;
  if (spec.type() == "adamw") {
    opt.adamw_ = true;
  } else if (spec.type() == "sgd") {
    opt.adamw_ = false;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.type: \"", spec.type(),
        "\" has no stage-local implementation (expected adamw or sgd)"));
  }
  int64_t expect = 0;
  for (const ParamSegment& s : segments) {
    if (s.offset != expect) {
      return absl::InternalError(
          absl::StrCat("parameter ", s.name, " is not contiguous"));
    }
    expect += s.size();
  }
  if (expect != total_size) {
    return absl::InternalError("parameter segments do not cover the buffer");
  }
  opt.segments_ = std::move(segments);
  for (size_t i = 0; i < opt.segments_.size(); ++i) {
    const ParamSegment& seg = opt.segments_[i];
    for (int64_t b = 0; b < seg.size(); b += kChunk) {
      opt.chunks_.push_back({static_cast<int>(i), seg.offset + b,
                             seg.offset + std::min(seg.size(), b + kChunk)});
    }
  }
  opt.total_size_ = total_size;
  auto zeros = [&](Tensor* t) -> absl::Status {
    if (opt.ctx_ != nullptr) {
      ASSIGN_OR_RETURN(*t, opt.ctx_->Zeros(DType::kFloat32, {total_size}));
    } else {
      ASSIGN_OR_RETURN(*t, Tensor::Create(DType::kFloat32, {total_size}));
      if (total_size > 0) std::memset(t->raw_data(), 0, t->nbytes());
    }
    return absl::OkStatus();
  };
  if (opt.adamw_) {
    RETURN_IF_ERROR(zeros(&opt.state1_));
    RETURN_IF_ERROR(zeros(&opt.state2_));
  } else if (spec.momentum() != 0.0) {
    RETURN_IF_ERROR(zeros(&opt.state1_));
  }
  return opt;
}

void StageOptimizer::Step(float* params, const float* grads, double lr,
                          double grad_scale) {
  ++step_count_;
  const float scale = static_cast<float>(grad_scale);
  if (adamw_) {
    const double beta1 = spec_.beta1(), beta2 = spec_.beta2();
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step_count_));
    const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step_count_));
    const float neg_step_size = static_cast<float>(-(lr / bc1));
    const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    // ptr(): the state is host memory here, or the simulated device's
    // (whose kernels this code also is).
    float* m = static_cast<float*>(state1_.ptr());
    float* v = static_cast<float*>(state2_.ptr());
    ParallelFor(static_cast<int>(chunks_.size()), [&](int c) {
      const Chunk& ch = chunks_[c];
      const double wd =
          segments_[ch.segment].decay ? spec_.weight_decay() : 0.0;
      AdamWKernel(ch.end - ch.begin, params + ch.begin, grads + ch.begin,
                  m + ch.begin, v + ch.begin, scale,
                  static_cast<float>(1.0 - lr * wd), static_cast<float>(beta1),
                  static_cast<float>(1.0 - beta1), static_cast<float>(beta2),
                  static_cast<float>(1.0 - beta2), bc2_sqrt,
                  static_cast<float>(spec_.eps()), neg_step_size);
    });
    return;
  }
  float* buf = state1_.defined() ? static_cast<float*>(state1_.ptr()) : nullptr;
  ParallelFor(static_cast<int>(chunks_.size()), [&](int c) {
    const Chunk& ch = chunks_[c];
    const double wd = segments_[ch.segment].decay ? spec_.weight_decay() : 0.0;
    SgdKernel(ch.end - ch.begin, params + ch.begin, grads + ch.begin,
              buf == nullptr ? nullptr : buf + ch.begin, scale,
              static_cast<float>(wd), static_cast<float>(spec_.momentum()),
              static_cast<float>(1.0 - spec_.dampening()), step_count_ == 1,
              spec_.nesterov(), static_cast<float>(-lr));
  });
}

absl::Status StageOptimizer::CheckFlat(const char* what,
                                       const Tensor& t) const {
  const Device want = ctx_ != nullptr ? ctx_->device() : Device::Cpu();
  if (t.dtype() != DType::kFloat32 || t.numel() != total_size_ ||
      t.device() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: ", what, " is ", DTypeName(t.dtype()),
        ShapeToString(t.shape()), " on ", t.device().ToString(),
        ", expected float32[", total_size_, "] on ", want.ToString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> StageOptimizer::LowPrecisionCopy(
    Tensor* params_bf16) const {
  if (params_bf16 == nullptr || !params_bf16->defined()) return nullptr;
  if (ctx_ == nullptr || params_bf16->dtype() != DType::kBFloat16 ||
      params_bf16->numel() != total_size_ ||
      params_bf16->device() != ctx_->device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: params_bf16 is ", DTypeName(params_bf16->dtype()),
        ShapeToString(params_bf16->shape()), " on ",
        params_bf16->device().ToString(), ", expected bfloat16[", total_size_,
        "] on the optimizer's GPU"));
  }
  return params_bf16->ptr();
}

absl::Status StageOptimizer::Step(Tensor* params, const Tensor& grads,
                                  double lr, double grad_scale,
                                  Tensor* params_bf16) {
  RETURN_IF_ERROR(CheckFlat("params", *params));
  RETURN_IF_ERROR(CheckFlat("grads", grads));
  ASSIGN_OR_RETURN(void* low, LowPrecisionCopy(params_bf16));
  if (ctx_ != nullptr) return StepOnDevice(params, grads, lr, grad_scale, low);
  Step(params->data<float>(), grads.data<float>(), lr, grad_scale);
  return absl::OkStatus();
}

absl::Status StageOptimizer::StepWithDeviceTotals(Tensor* params,
                                                  const Tensor& grads,
                                                  double lr,
                                                  const double* totals,
                                                  Tensor* params_bf16) {
  if (ctx_ == nullptr || totals == nullptr) {
    return absl::FailedPreconditionError(
        "optimizer: a device step's totals need a device optimizer");
  }
  RETURN_IF_ERROR(CheckFlat("params", *params));
  RETURN_IF_ERROR(CheckFlat("grads", grads));
  ASSIGN_OR_RETURN(void* low, LowPrecisionCopy(params_bf16));
  return StepOnDevice(params, grads, lr, 1.0, low, totals);
}

absl::Status StageOptimizer::StepOnDevice(Tensor* params, const Tensor& grads,
                                          double lr, double grad_scale,
                                          void* params_bf16,
                                          const double* totals) {
  const std::vector<ParamSegment>& segs = segments_;
  float* p = static_cast<float*>(params->ptr());
  const float* g = static_cast<const float*>(grads.ptr());
  if (ctx_->device().is_sim()) {
    // The simulated device's kernel is the CPU update itself, reading the
    // device's totals like the GPU kernels do.
    if (totals != nullptr) {
      if (totals[kTotalsSkipWord] != 0) {
        ++step_count_;
        return absl::OkStatus();
      }
      grad_scale = totals[kTotalsScaleWord];
    }
    Step(p, g, lr, grad_scale);
    return absl::OkStatus();
  }
  if (adamw_) {
    gpu::AdamWStep hp;
    hp.lr = lr;
    hp.beta1 = spec_.beta1();
    hp.beta2 = spec_.beta2();
    hp.eps = spec_.eps();
    hp.weight_decay = spec_.weight_decay();
    hp.step = step_count_ + 1;
    hp.grad_scale = grad_scale;
    RETURN_IF_ERROR(gpu::FusedAdamW(segs, hp, p, g,
                                    static_cast<float*>(state1_.ptr()),
                                    static_cast<float*>(state2_.ptr()),
                                    params_bf16, ctx_->stream(), totals));
  } else {
    gpu::SgdStep hp;
    hp.lr = lr;
    hp.momentum = spec_.momentum();
    hp.dampening = spec_.dampening();
    hp.weight_decay = spec_.weight_decay();
    hp.nesterov = spec_.nesterov();
    hp.first_step = step_count_ == 0;
    hp.grad_scale = grad_scale;
    float* buf =
        state1_.defined() ? static_cast<float*>(state1_.ptr()) : nullptr;
    RETURN_IF_ERROR(gpu::FusedSgd(segs, hp, p, g, buf, params_bf16,
                                  ctx_->stream(), totals));
  }
  ++step_count_;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> StageOptimizer::GradSumsOfSquares(
    const Tensor& grads) const {
  RETURN_IF_ERROR(CheckFlat("grads", grads));
  if (ctx_ == nullptr) return GradSumsOfSquares(grads.data<float>());
  const int n = static_cast<int>(segments_.size());
  ASSIGN_OR_RETURN(Tensor sums, ctx_->Empty(DType::kFloat64, {n}));
  RETURN_IF_ERROR(
      GradSumsOfSquaresOnDevice(grads, static_cast<double*>(sums.ptr())));
  ASSIGN_OR_RETURN(Tensor host, ctx_->ToHost(sums));
  return std::vector<double>(host.data<double>(), host.data<double>() + n);
}

absl::Status StageOptimizer::GradSumsOfSquaresOnDevice(const Tensor& grads,
                                                       double* out) const {
  RETURN_IF_ERROR(CheckFlat("grads", grads));
  if (ctx_ == nullptr) {
    return absl::FailedPreconditionError(
        "optimizer: sums of squares on the device need a device optimizer");
  }
  if (ctx_->device().is_sim()) {
    // The simulated device's kernel is the CPU reduction (same bits).
    const std::vector<double> sums =
        GradSumsOfSquares(static_cast<const float*>(grads.ptr()));
    std::copy(sums.begin(), sums.end(), out);
    return absl::OkStatus();
  }
  const int64_t bytes =
      static_cast<int64_t>(gpu::GradSumsOfSquaresWorkspaceBytes(segments_));
  if (norm_workspace_.numel() < bytes) {
    ASSIGN_OR_RETURN(norm_workspace_, ctx_->Empty(DType::kUInt8, {bytes}));
  }
  return gpu::GradSumsOfSquares(segments_,
                                static_cast<const float*>(grads.ptr()),
                                norm_workspace_.ptr(), out, ctx_->stream());
}

std::vector<double> StageOptimizer::GradSumsOfSquares(
    const float* grads) const {
  std::vector<double> partial(chunks_.size());
  ParallelFor(static_cast<int>(chunks_.size()), [&](int c) {
    partial[c] = SumOfSquares(grads + chunks_[c].begin,
                              chunks_[c].end - chunks_[c].begin);
  });
  std::vector<double> out(segments_.size(), 0.0);
  for (size_t c = 0; c < chunks_.size(); ++c)
    out[chunks_[c].segment] += partial[c];
  return out;
}

NamedTensors StageOptimizer::StateTensors() const {
  NamedTensors out;
  for (const ParamSegment& s : segments_) {
    if (adamw_) {
      out.push_back({"optimizer." + s.name + ".exp_avg", s.Of(state1_)});
      out.push_back({"optimizer." + s.name + ".exp_avg_sq", s.Of(state2_)});
    } else if (state1_.defined()) {
      out.push_back(
          {"optimizer." + s.name + ".momentum_buffer", s.Of(state1_)});
    }
  }
  return out;
}

absl::Status StageOptimizer::LoadState(
    const std::map<std::string, Tensor>& tensors, int64_t step_count) {
  for (auto& [name, dst] : StateTensors()) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      return absl::NotFoundError(
          absl::StrCat("optimizer state tensor ", name, " is missing"));
    }
    if (it->second.dtype() != DType::kFloat32 ||
        it->second.shape() != dst.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state tensor ", name, " has ",
          DTypeName(it->second.dtype()), ShapeToString(it->second.shape()),
          ", expected float32", ShapeToString(dst.shape())));
    }
    Tensor alias = dst;
    if (ctx_ != nullptr) {
      RETURN_IF_ERROR(ctx_->CopyInto(it->second, &alias));
    } else {
      alias.CopyFrom(it->second);
    }
  }
  step_count_ = step_count;
  return absl::OkStatus();
}

}  // namespace trainyard
