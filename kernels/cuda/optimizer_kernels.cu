// Kernels first, then the launchers of optimizer_kernels.h.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/step_totals.h"
#include "kernels/cuda/cuda_math.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/optimizer_kernels.h"

namespace trainyard {
namespace gpu {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kMaxSegments = 48;
constexpr int kThreads = 256;
constexpr int64_t kElemsPerBlock = 4096;

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

// Same expression order as engine/optimizer.cc's AdamWKernel, with explicit
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

// One element of the AdamW update, in engine/optimizer.cc's order.
struct AdamWScalars {
  float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt,
      eps, neg_step_size;
};
__device__ __forceinline__ void AdamWElement(const AdamWScalars& k, float decay,
                                             float g_raw, float* p, float* m,
                                             float* v) {
  const float g = __fmul_rn(g_raw, k.grad_scale);
  const float pi = __fmul_rn(*p, decay);
  const float mi =
      __fadd_rn(__fmul_rn(*m, k.beta1), __fmul_rn(k.one_minus_beta1, g));
  const float vi = __fadd_rn(__fmul_rn(*v, k.beta2),
                             __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
  *m = mi;
  *v = vi;
  *p = __fadd_rn(pi, __fdiv_rn(__fmul_rn(k.neg_step_size, mi), denom));
}

// Each thread updates 4 consecutive elements per iteration: with 16-byte
// loads and stores where the 4 are aligned (the flat buffers are; a
// segment's offset may not be), element by element otherwise. The
// arithmetic per element is the same either way: bit for bit the CPU's.
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
  const AdamWScalars k{grad_scale, beta1,           one_minus_beta1,
                       beta2,      one_minus_beta2, bc2_sqrt,
                       eps,        neg_step_size};
  const int s = FindSegment(t, blockIdx.x);
  const int64_t begin =
      t.offset[s] + (blockIdx.x - t.block_start[s]) * kElemsPerBlock;
  const int64_t end = min(begin + kElemsPerBlock, t.offset[s] + t.size[s]);
  const float decay = t.scalar[s];
  for (int64_t i = begin + 4 * int64_t{threadIdx.x}; i < end;
       i += 4 * int64_t{blockDim.x}) {
    if (i + 4 <= end && i % 4 == 0) {
      float4 pv = *reinterpret_cast<const float4*>(p + i);
      const float4 gv = *reinterpret_cast<const float4*>(g_raw + i);
      float4 mv = *reinterpret_cast<const float4*>(m + i);
      float4 vv = *reinterpret_cast<const float4*>(v + i);
      AdamWElement(k, decay, gv.x, &pv.x, &mv.x, &vv.x);
      AdamWElement(k, decay, gv.y, &pv.y, &mv.y, &vv.y);
      AdamWElement(k, decay, gv.z, &pv.z, &mv.z, &vv.z);
      AdamWElement(k, decay, gv.w, &pv.w, &mv.w, &vv.w);
      *reinterpret_cast<float4*>(p + i) = pv;
      *reinterpret_cast<float4*>(m + i) = mv;
      *reinterpret_cast<float4*>(v + i) = vv;
      if (p16 != nullptr) {
        p16[i] = __float2bfloat16_rn(pv.x);
        p16[i + 1] = __float2bfloat16_rn(pv.y);
        p16[i + 2] = __float2bfloat16_rn(pv.z);
        p16[i + 3] = __float2bfloat16_rn(pv.w);
      }
      continue;
    }
    for (int64_t j = i; j < min(i + 4, end); ++j) {
      AdamWElement(k, decay, g_raw[j], &p[j], &m[j], &v[j]);
      if (p16 != nullptr) p16[j] = __float2bfloat16_rn(p[j]);
    }
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

// Sums of squares, in two deterministic stages. Stage 1: segment s gets
// NormBlocks(size) blocks (a grid proportional to its size); the block's
// threads sum a fixed strided subset of its 4-element groups with 16-byte
// loads in double, then a fixed shared-memory tree gives the block's
// partial; the segment's unaligned head and tail elements go to block 0's
// thread 0. Stage 2: one block per segment adds its partials in a fixed
// tree. The split depends only on the segments: the same bits every run.
constexpr int64_t kNormElemsPerBlock = 32768;
constexpr int kMaxNormBlocks = 1024;  // per segment

int64_t NormBlocks(int64_t size) {
  const int64_t b = (size + kNormElemsPerBlock - 1) / kNormElemsPerBlock;
  return b < 1 ? 1 : (b > kMaxNormBlocks ? kMaxNormBlocks : b);
}

__global__ void SumSquaresPartialKernel(SegmentTable t,
                                        const float* __restrict__ g,
                                        double* __restrict__ partial) {
  __shared__ double sh[kThreads];
  const int s = FindSegment(t, blockIdx.x);
  const int64_t block = blockIdx.x - t.block_start[s];
  const int64_t blocks = t.block_start[s + 1] - t.block_start[s];
  const int64_t off = t.offset[s], n = t.size[s];
  // [head, body_end): whole 16-byte aligned groups of 4.
  int64_t head = (4 - off % 4) % 4;
  if (head > n) head = n;
  const int64_t groups = (n - head) / 4;
  const float* body = g + off + head;
  double acc = 0.0;
  for (int64_t q = block * kThreads + threadIdx.x; q < groups;
       q += blocks * kThreads) {
    const float4 x = reinterpret_cast<const float4*>(body)[q];
    acc += static_cast<double>(x.x) * x.x;
    acc += static_cast<double>(x.y) * x.y;
    acc += static_cast<double>(x.z) * x.z;
    acc += static_cast<double>(x.w) * x.w;
  }
  if (block == 0 && threadIdx.x == 0) {
    for (int64_t i = 0; i < head; ++i) {
      const double x = g[off + i];
      acc += x * x;
    }
    for (int64_t i = head + 4 * groups; i < n; ++i) {
      const double x = g[off + i];
      acc += x * x;
    }
  }
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

// One block per segment of the table; out[s] = its partials' sum.
__global__ void SumSquaresFinalKernel(SegmentTable t,
                                      const double* __restrict__ partial,
                                      double* __restrict__ out) {
  __shared__ double sh[kThreads];
  const int s = blockIdx.x;
  double acc = 0.0;
  for (int64_t b = t.block_start[s] + threadIdx.x; b < t.block_start[s + 1];
       b += kThreads) {
    acc += partial[b];
  }
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
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

// Calls launch(table, blocks) for each run of up to kMaxSegments segments
// that has elements: its table, with per-segment `scalar(segment)`, and its
// total blocks. Stops at the first error.
template <typename F, typename L>
absl::Status ForEachTable(const std::vector<ParamSegment>& segs, F scalar,
                          L launch) {
  for (size_t first = 0; first < segs.size(); first += kMaxSegments) {
    const int count =
        static_cast<int>(std::min<size_t>(kMaxSegments, segs.size() - first));
    SegmentTable t;
    const int64_t blocks = BuildTable(segs, first, count, scalar, &t);
    if (blocks == 0) continue;
    TY_RETURN_IF_ERROR(launch(t, static_cast<unsigned>(blocks)));
  }
  return absl::OkStatus();
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
  for (const void* ptr :
       {static_cast<const void*>(params), static_cast<const void*>(grads),
        static_cast<const void*>(exp_avg),
        static_cast<const void*>(exp_avg_sq)}) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
      return absl::InvalidArgumentError(
          "FusedAdamW: params, grads and state must be 16-byte aligned (flat "
          "buffers)");
    }
  }
  // Scalars exactly as StageOptimizer::Step computes them.
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  const float neg_step_size = static_cast<float>(-(hp.lr / bc1));
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  return ForEachTable(
      segments,
      [&](const ParamSegment& s) {
        const double wd = s.decay ? hp.weight_decay : 0.0;
        return static_cast<float>(1.0 - hp.lr * wd);
      },
      [&](const SegmentTable& t, unsigned blocks) -> absl::Status {
        AdamWKernel<<<blocks, kThreads, 0, stream>>>(
            t, params, grads, exp_avg, exp_avg_sq,
            static_cast<bf16*>(params_bf16), static_cast<float>(hp.grad_scale),
            device_totals, static_cast<float>(hp.beta1),
            static_cast<float>(1.0 - hp.beta1), static_cast<float>(hp.beta2),
            static_cast<float>(1.0 - hp.beta2), bc2_sqrt,
            static_cast<float>(hp.eps), neg_step_size);
        CUDA_RETURN_IF_LAUNCH_ERROR("AdamWKernel");
        return absl::OkStatus();
      });
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
  return ForEachTable(
      segments,
      [&](const ParamSegment& s) {
        return static_cast<float>(s.decay ? hp.weight_decay : 0.0);
      },
      [&](const SegmentTable& t, unsigned blocks) -> absl::Status {
        SgdKernel<<<blocks, kThreads, 0, stream>>>(
            t, params, grads, buf, static_cast<bf16*>(params_bf16),
            static_cast<float>(hp.grad_scale), device_totals,
            static_cast<float>(hp.momentum),
            static_cast<float>(1.0 - hp.dampening), hp.first_step, hp.nesterov,
            static_cast<float>(-hp.lr));
        CUDA_RETURN_IF_LAUNCH_ERROR("SgdKernel");
        return absl::OkStatus();
      });
}

size_t GradSumsOfSquaresWorkspaceBytes(
    const std::vector<ParamSegment>& segments) {
  int64_t blocks = 0;
  for (const ParamSegment& s : segments) blocks += NormBlocks(s.size());
  return static_cast<size_t>(blocks) * sizeof(double);
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
  if (reinterpret_cast<uintptr_t>(grads) % 16 != 0) {
    return absl::InvalidArgumentError(
        "GradSumsOfSquares: grads must be 16-byte aligned (a flat buffer)");
  }
  double* partial = static_cast<double*>(workspace);
  for (size_t first = 0; first < segments.size(); first += kMaxSegments) {
    const int count = static_cast<int>(
        std::min<size_t>(kMaxSegments, segments.size() - first));
    SegmentTable t;
    t.count = count;
    int64_t blocks = 0;
    for (int i = 0; i < count; ++i) {
      const ParamSegment& seg = segments[first + i];
      t.offset[i] = seg.offset;
      t.size[i] = seg.size();
      t.scalar[i] = 0.0f;
      t.block_start[i] = blocks;
      blocks += NormBlocks(seg.size());
    }
    t.block_start[count] = blocks;
    SumSquaresPartialKernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                              stream>>>(t, grads, partial);
    CUDA_RETURN_IF_LAUNCH_ERROR("SumSquaresPartialKernel");
    SumSquaresFinalKernel<<<static_cast<unsigned>(count), kThreads, 0,
                            stream>>>(t, partial, out + first);
    CUDA_RETURN_IF_LAUNCH_ERROR("SumSquaresFinalKernel");
    partial += blocks;
  }
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace trainyard
