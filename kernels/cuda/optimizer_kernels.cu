// Kernels first, then the launchers of optimizer_kernels.h.
#include <algorithm>
#include <cmath>

#include "core/cuda_status.h"
#include "core/step_totals.h"
#include "kernels/cuda/cuda_math.cuh"
#include "kernels/cuda/optimizer_kernels.h"

namespace trainyard {
namespace gpu {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kMaxSegments = 48;
constexpr int kThreads = 256;
constexpr int64_t kElemsPerBlock = 4096;
constexpr int kNormBlocks = 64;  // blocks per segment for sums of squares

// Passed by value as a kernel parameter (about 1.6 KB).
struct SegmentTable {
  int count;
  int64_t offset[kMaxSegments];
  int64_t size[kMaxSegments];
  float scalar[kMaxSegments];             // decay factor or weight decay
  int64_t block_start[kMaxSegments + 1];  // prefix of blocks per segment
};

__device__ __forceinline__ int FindSegment(const SegmentTable& t,
                                           int64_t block) {
  int s = 0;
  while (s + 1 < t.count && t.block_start[s + 1] <= block) ++s;
  return s;
}

// Same expression order as worker/optimizer.cc's AdamWKernel, with explicit
// round-to-nearest intrinsics so nvcc cannot contract into FMAs.
// The gradient scale: `fixed`, or the one a device step computed (and
// whether that step must not change anything).
__device__ __forceinline__ bool ScaleFor(const double* totals, float fixed,
                                         float* scale) {
  if (totals == nullptr) {
    *scale = fixed;
    return true;
  }
  if (totals[kTotalsSkipWord] != 0.0) return false;
  *scale = static_cast<float>(totals[kTotalsScaleWord]);
  return true;
}

__global__ void AdamWKernel(SegmentTable t, float* __restrict__ p,
                            const float* __restrict__ g_raw,
                            float* __restrict__ m, float* __restrict__ v,
                            bf16* __restrict__ p16, float fixed_scale,
                            const double* __restrict__ totals, float beta1,
                            float one_minus_beta1, float beta2,
                            float one_minus_beta2, float bc2_sqrt, float eps,
                            float neg_step_size) {
  float grad_scale;
  if (!ScaleFor(totals, fixed_scale, &grad_scale)) return;
  const int s = FindSegment(t, blockIdx.x);
  const int64_t begin =
      t.offset[s] + (blockIdx.x - t.block_start[s]) * kElemsPerBlock;
  const int64_t end = min(begin + kElemsPerBlock, t.offset[s] + t.size[s]);
  const float decay = t.scalar[s];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = __fmul_rn(g_raw[i], grad_scale);
    const float pi = __fmul_rn(p[i], decay);
    const float mi =
        __fadd_rn(__fmul_rn(m[i], beta1), __fmul_rn(one_minus_beta1, g));
    const float vi = __fadd_rn(__fmul_rn(v[i], beta2),
                               __fmul_rn(__fmul_rn(one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    m[i] = mi;
    v[i] = vi;
    const float np =
        __fadd_rn(pi, __fdiv_rn(__fmul_rn(neg_step_size, mi), denom));
    p[i] = np;
    if (p16 != nullptr) p16[i] = __float2bfloat16_rn(np);
  }
}

__global__ void SgdKernel(SegmentTable t, float* __restrict__ p,
                          const float* __restrict__ g_raw,
                          float* __restrict__ buf, bf16* __restrict__ p16,
                          float fixed_scale, const double* __restrict__ totals,
                          float momentum, float one_minus_dampening, bool first,
                          bool nesterov, float neg_lr) {
  float grad_scale;
  if (!ScaleFor(totals, fixed_scale, &grad_scale)) return;
  const int s = FindSegment(t, blockIdx.x);
  const int64_t begin =
      t.offset[s] + (blockIdx.x - t.block_start[s]) * kElemsPerBlock;
  const int64_t end = min(begin + kElemsPerBlock, t.offset[s] + t.size[s]);
  const float wd = t.scalar[s];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float g = __fmul_rn(g_raw[i], grad_scale);
    if (wd != 0.0f) g = __fadd_rn(g, __fmul_rn(wd, p[i]));
    if (buf != nullptr) {
      const float b = first ? g
                            : __fadd_rn(__fmul_rn(buf[i], momentum),
                                        __fmul_rn(one_minus_dampening, g));
      buf[i] = b;
      g = nesterov ? __fadd_rn(g, __fmul_rn(momentum, b)) : b;
    }
    const float np = __fadd_rn(p[i], __fmul_rn(neg_lr, g));
    p[i] = np;
    if (p16 != nullptr) p16[i] = __float2bfloat16_rn(np);
  }
}

// grid (kNormBlocks, segments): each thread sums a fixed strided subset in
// double, then a fixed shared-memory tree; partial [seg][block].
__global__ void SumSquaresPartialKernel(SegmentTable t,
                                        const float* __restrict__ g,
                                        double* __restrict__ partial,
                                        int seg_base) {
  __shared__ double sh[kThreads];
  const int s = blockIdx.y;
  const int64_t off = t.offset[s], n = t.size[s];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{kNormBlocks} * kThreads) {
    const double x = g[off + i];
    acc += x * x;
  }
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partial[(seg_base + s) * int64_t{kNormBlocks} + blockIdx.x] = sh[0];
  }
}

__global__ void SumSquaresFinalKernel(const double* __restrict__ partial,
                                      double* __restrict__ out) {
  __shared__ double sh[kNormBlocks];
  const int s = blockIdx.x;
  sh[threadIdx.x] = partial[s * int64_t{kNormBlocks} + threadIdx.x];
  __syncthreads();
  for (int w = kNormBlocks / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[s] = sh[0];
}

// Builds the table for segments [first, first + count) with per-segment
// `scalar(segment)`; returns the total blocks.
template <typename F>
int64_t BuildTable(const std::vector<ParamSegment>& segs, size_t first,
                   int count, F scalar, SegmentTable* t) {
  t->count = count;
  int64_t blocks = 0;
  for (int i = 0; i < count; ++i) {
    const ParamSegment& s = segs[first + i];
    t->offset[i] = s.offset;
    t->size[i] = s.size();
    t->scalar[i] = scalar(s);
    t->block_start[i] = blocks;
    blocks += (s.size() + kElemsPerBlock - 1) / kElemsPerBlock;
  }
  t->block_start[count] = blocks;
  return blocks;
}

absl::Status CheckSegments(const char* what,
                           const std::vector<ParamSegment>& segs) {
  for (size_t i = 0; i < segs.size(); ++i) {
    if (segs[i].offset < 0 || segs[i].size() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": segment ", i, " has negative offset or size"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FusedAdamW(const std::vector<ParamSegment>& segments,
                        const AdamWStep& hp, float* params, const float* grads,
                        float* exp_avg, float* exp_avg_sq, void* params_bf16,
                        Stream stream, const double* device_totals) {
  TY_RETURN_IF_ERROR(CheckSegments("FusedAdamW", segments));
  if (hp.step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("FusedAdamW: step must be >= 1, got ", hp.step));
  }
  if (segments.empty()) return absl::OkStatus();
  if (!params || !grads || !exp_avg || !exp_avg_sq) {
    return absl::InvalidArgumentError(
        "FusedAdamW: params, grads, exp_avg and exp_avg_sq must be non-null");
  }
  // Scalars exactly as StageOptimizer::Step computes them.
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  const float neg_step_size = static_cast<float>(-(hp.lr / bc1));
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  for (size_t first = 0; first < segments.size(); first += kMaxSegments) {
    const int count = static_cast<int>(
        std::min<size_t>(kMaxSegments, segments.size() - first));
    SegmentTable t;
    const int64_t blocks = BuildTable(
        segments, first, count,
        [&](const ParamSegment& s) {
          const double wd = s.decay ? hp.weight_decay : 0.0;
          return static_cast<float>(1.0 - hp.lr * wd);
        },
        &t);
    if (blocks == 0) continue;
    AdamWKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        t, params, grads, exp_avg, exp_avg_sq, static_cast<bf16*>(params_bf16),
        static_cast<float>(hp.grad_scale), device_totals,
        static_cast<float>(hp.beta1), static_cast<float>(1.0 - hp.beta1),
        static_cast<float>(hp.beta2), static_cast<float>(1.0 - hp.beta2),
        bc2_sqrt, static_cast<float>(hp.eps), neg_step_size);
    CUDA_RETURN_IF_LAUNCH_ERROR("AdamWKernel");
  }
  return absl::OkStatus();
}

absl::Status FusedSgd(const std::vector<ParamSegment>& segments,
                      const SgdStep& hp, float* params, const float* grads,
                      float* momentum_buffer, void* params_bf16, Stream stream,
                      const double* device_totals) {
  TY_RETURN_IF_ERROR(CheckSegments("FusedSgd", segments));
  if (segments.empty()) return absl::OkStatus();
  if (!params || !grads) {
    return absl::InvalidArgumentError(
        "FusedSgd: params and grads must be non-null");
  }
  if (hp.momentum != 0.0 && momentum_buffer == nullptr) {
    return absl::InvalidArgumentError(
        "FusedSgd: momentum != 0 needs a momentum buffer");
  }
  float* buf = hp.momentum != 0.0 ? momentum_buffer : nullptr;
  for (size_t first = 0; first < segments.size(); first += kMaxSegments) {
    const int count = static_cast<int>(
        std::min<size_t>(kMaxSegments, segments.size() - first));
    SegmentTable t;
    const int64_t blocks = BuildTable(
        segments, first, count,
        [&](const ParamSegment& s) {
          return static_cast<float>(s.decay ? hp.weight_decay : 0.0);
        },
        &t);
    if (blocks == 0) continue;
    SgdKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        t, params, grads, buf, static_cast<bf16*>(params_bf16),
        static_cast<float>(hp.grad_scale), device_totals,
        static_cast<float>(hp.momentum), static_cast<float>(1.0 - hp.dampening),
        hp.first_step, hp.nesterov, static_cast<float>(-hp.lr));
    CUDA_RETURN_IF_LAUNCH_ERROR("SgdKernel");
  }
  return absl::OkStatus();
}

size_t GradSumsOfSquaresWorkspaceBytes(int num_segments) {
  return static_cast<size_t>(num_segments) * kNormBlocks * sizeof(double);
}

absl::Status GradSumsOfSquares(const std::vector<ParamSegment>& segments,
                               const float* grads, void* workspace, double* out,
                               Stream stream) {
  TY_RETURN_IF_ERROR(CheckSegments("GradSumsOfSquares", segments));
  if (segments.empty()) return absl::OkStatus();
  if (!grads || !workspace || !out) {
    return absl::InvalidArgumentError(
        "GradSumsOfSquares: grads, workspace and out must be non-null");
  }
  double* partial = static_cast<double*>(workspace);
  for (size_t first = 0; first < segments.size(); first += kMaxSegments) {
    const int count = static_cast<int>(
        std::min<size_t>(kMaxSegments, segments.size() - first));
    SegmentTable t;
    BuildTable(
        segments, first, count, [](const ParamSegment&) { return 0.0f; }, &t);
    SumSquaresPartialKernel<<<dim3(kNormBlocks, count), kThreads, 0, stream>>>(
        t, grads, partial, static_cast<int>(first));
    CUDA_RETURN_IF_LAUNCH_ERROR("SumSquaresPartialKernel");
  }
  SumSquaresFinalKernel<<<static_cast<unsigned>(segments.size()), kNormBlocks,
                          0, stream>>>(partial, out);
  CUDA_RETURN_IF_LAUNCH_ERROR("SumSquaresFinalKernel");
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace trainyard
