#include "worker/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
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

// Sum of squares in double with a fixed lane structure, so the result does
// not depend on the compiler's vector width.
double SumOfSquares(const float* x, int64_t n) {
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const double v = x[i + j];
      lanes[j] += v * v;
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
    std::vector<ParamSegment> segments, int64_t total_size) {
  StageOptimizer opt;
  opt.spec_ = spec;
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
  if (opt.adamw_) {
    opt.state1_ = Tensor::Zeros(DType::kFloat32, {total_size});
    opt.state2_ = Tensor::Zeros(DType::kFloat32, {total_size});
  } else if (spec.momentum() != 0.0) {
    opt.state1_ = Tensor::Zeros(DType::kFloat32, {total_size});
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
    float* m = state1_.data<float>();
    float* v = state2_.data<float>();
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
  float* buf = state1_.defined() ? state1_.data<float>() : nullptr;
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

std::vector<std::pair<std::string, Tensor>> StageOptimizer::StateTensors()
    const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const ParamSegment& s : segments_) {
    auto slice = [&](const Tensor& t) {
      return t.Rows(s.offset, s.offset + s.size()).View(s.shape);
    };
    if (adamw_) {
      out.push_back({"optimizer." + s.name + ".exp_avg", slice(state1_)});
      out.push_back({"optimizer." + s.name + ".exp_avg_sq", slice(state2_)});
    } else if (state1_.defined()) {
      out.push_back(
          {"optimizer." + s.name + ".momentum_buffer", slice(state1_)});
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
    alias.CopyFrom(it->second);
  }
  step_count_ = step_count;
  return absl::OkStatus();
}

}  // namespace trainyard
