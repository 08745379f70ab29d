// Kernels first, then the launchers of loss_kernels.h.
#include <cfloat>

#include "kernels/cuda/cuda_math.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/loss_kernels.h"

namespace trainyard {
namespace gpu {
namespace {

using bf16 = __nv_bfloat16;
using internal::Load;
using internal::Store;
using internal::WarpSum;

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;  // one warp per row
constexpr int kFinalThreads = 1024;
constexpr int kMseMaxBlocks = kFinalThreads;  // partials the final sums
constexpr int64_t kMseItemsPerThread = 16;

// Fixed tree over the block's shared array of blockDim.x doubles (a power
// of two); every thread gets the sum.
__device__ double BlockSum(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

// losses.h's weighted gradient: float32(dLoss/dOutput) times float32(w),
// rounded, in the output's dtype.
template <typename T>
__device__ __forceinline__ void StoreWeighted(T* grad, int64_t i, double g,
                                              float w) {
  Store(grad, i, __fmul_rn(__double2float_rn(g), w));
}

__device__ __forceinline__ int64_t LabelAt(const void* labels, bool wide,
                                           int64_t r) {
  return wide ? static_cast<const int64_t*>(labels)[r]
              : static_cast<const int32_t*>(labels)[r];
}

// The larger value wins; on a tie the smaller index (the first maximum);
// index -1 is "nothing yet".
__device__ __forceinline__ void ArgMaxCombine(float* v, int64_t* i, float ov,
                                              int64_t oi) {
  if (oi >= 0 && (*i < 0 || ov > *v || (ov == *v && oi < *i))) {
    *v = ov;
    *i = oi;
  }
}

__device__ __forceinline__ void WarpArgMax(float* v, int64_t* i) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float ov = __shfl_xor_sync(kFullMask, *v, offset);
    const long long oi =
        __shfl_xor_sync(kFullMask, static_cast<long long>(*i), offset);
    ArgMaxCombine(v, i, ov, oi);
  }
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

// ---- MSE.

template <typename T>
__global__ void MsePartialKernel(int64_t n, const T* __restrict__ out,
                                 const float* __restrict__ target,
                                 T* __restrict__ grad, float w,
                                 double* __restrict__ partial) {
  __shared__ double sh[kThreads];
  const double dn = static_cast<double>(n);
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads) {
    const double d =
        static_cast<double>(Load(out, i)) - static_cast<double>(target[i]);
    acc += d * d;
    if (grad != nullptr) StoreWeighted(grad, i, 2.0 * d / dn, w);
  }
  const double s = BlockSum(acc, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void MseFinalKernel(int64_t rows, int64_t n, int blocks,
                               const double* __restrict__ partial,
                               double* __restrict__ slots) {
  __shared__ double sh[kFinalThreads];
  const double s = BlockSum(
      static_cast<int>(threadIdx.x) < blocks ? partial[threadIdx.x] : 0.0, sh);
  if (threadIdx.x == 0) {
    const double dn = static_cast<double>(n);
    slots[0] = static_cast<double>(rows);
    slots[1] = slots[0] * (s / dn);
    slots[4] = s;
    slots[5] = dn;
  }
}

// ---- Classifiers (cross-entropy, distillation).
//
// Workspace: ws[0] rows with a label that is not ignored, ws[1] the first
// bad row (-1: none), then `per_row` arrays of `rows` doubles.

// One block of kFinalThreads.
__global__ void CountLabelsKernel(int64_t rows, int64_t classes,
                                  const void* labels, bool wide, int64_t ignore,
                                  double* __restrict__ ws,
                                  double* __restrict__ slots) {
  __shared__ double sh[kFinalThreads];
  __shared__ unsigned long long bad;
  if (threadIdx.x == 0) bad = ~0ull;
  __syncthreads();
  double count = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t y = LabelAt(labels, wide, r);
    if (y == ignore) continue;
    if (y < 0 || y >= classes) {
      atomicMin(&bad, static_cast<unsigned long long>(r));  // integer: exact
    } else {
      count += 1.0;
    }
  }
  const double total = BlockSum(count, sh);  // also orders the atomics
  if (threadIdx.x == 0) {
    ws[0] = total;
    ws[1] = -1.0;
    if (bad != ~0ull) {
      const int64_t r = static_cast<int64_t>(bad);
      ws[1] = static_cast<double>(r);
      slots[2] = static_cast<double>(r) + 1.0;
      slots[3] = static_cast<double>(LabelAt(labels, wide, r));
    }
  }
}

// One warp per row. Row arrays: loss_i, correct_i.
template <typename T>
__global__ void CrossEntropyRowKernel(int64_t rows, int64_t c,
                                      const T* __restrict__ x,
                                      const void* labels, bool wide,
                                      int64_t ignore, double eps,
                                      T* __restrict__ grad,
                                      double* __restrict__ ws) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (r >= rows || ws[1] >= 0) return;  // whole warps; a bad label stops all
  const double n = ws[0];
  double* row_loss = ws + 2;
  double* row_correct = ws + 2 + rows;
  const int64_t y = LabelAt(labels, wide, r);
  const T* row = x + r * c;
  if (y == ignore) {
    if (grad != nullptr) {
      for (int64_t k = lane; k < c; k += 32) Store(grad, r * c + k, 0.0f);
    }
    if (lane == 0) row_loss[r] = row_correct[r] = 0.0;
    return;
  }
  float best = 0.0f;
  int64_t arg = -1;
  for (int64_t k = lane; k < c; k += 32) {
    ArgMaxCombine(&best, &arg, Load(row, k), k);
  }
  WarpArgMax(&best, &arg);
  const double m = static_cast<double>(best);
  double se = 0.0, sx = 0.0;
  for (int64_t k = lane; k < c; k += 32) {
    const double v = static_cast<double>(Load(row, k));
    se += exp(v - m);
    sx += v;
  }
  se = WarpSum(se);
  sx = WarpSum(sx);
  const double lse = m + log(se);  // log p[k] = x_k - lse
  if (grad != nullptr) {
    const float w = __double2float_rn(n);
    for (int64_t k = lane; k < c; k += 32) {
      const double logp = static_cast<double>(Load(row, k)) - lse;
      const double target = (k == y ? 1.0 - eps : 0.0) + eps / c;
      StoreWeighted(grad, r * c + k, (exp(logp) - target) / n, w);
    }
  }
  if (lane == 0) {
    const double nll = lse - static_cast<double>(Load(row, y));
    const double smooth = static_cast<double>(c) * lse - sx;  // sum -log p
    row_loss[r] = (1.0 - eps) * nll + eps * smooth / c;
    row_correct[r] = arg == y ? 1.0 : 0.0;
  }
}

// One warp per row. Row arrays: kl_i, ce_i, correct_i.
template <typename T>
__global__ void DistillationRowKernel(int64_t rows, int64_t c,
                                      const T* __restrict__ s_all,
                                      const float* __restrict__ z_all,
                                      const void* labels, bool wide,
                                      int64_t ignore, double t, double alpha,
                                      T* __restrict__ grad,
                                      double* __restrict__ ws) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (r >= rows || ws[1] >= 0) return;
  const double n = ws[0];
  double* row_kl = ws + 2;
  double* row_ce = ws + 2 + rows;
  double* row_correct = ws + 2 + 2 * rows;
  const int64_t y = LabelAt(labels, wide, r);
  if (y == ignore) {
    if (grad != nullptr) {
      for (int64_t k = lane; k < c; k += 32) Store(grad, r * c + k, 0.0f);
    }
    if (lane == 0) row_kl[r] = row_ce[r] = row_correct[r] = 0.0;
    return;
  }
  const T* s = s_all + r * c;
  const float* z = z_all + r * c;
  float best = 0.0f, zmax = -FLT_MAX;
  int64_t arg = -1;
  for (int64_t k = lane; k < c; k += 32) {
    ArgMaxCombine(&best, &arg, Load(s, k), k);
    zmax = fmaxf(zmax, z[k]);
  }
  WarpArgMax(&best, &arg);
  zmax = WarpMax(zmax);
  const double scale = 1.0 / t;
  const double ms = static_cast<double>(best);
  const double mq = scale * ms;  // max of scale * s (rounding is monotone)
  const double mp = scale * static_cast<double>(zmax);
  double sq = 0.0, sp = 0.0, ss = 0.0;
  for (int64_t k = lane; k < c; k += 32) {
    const double sk = static_cast<double>(Load(s, k));
    const double zk = static_cast<double>(z[k]);
    sq += exp(scale * sk - mq);
    sp += exp(scale * zk - mp);
    ss += exp(sk - ms);
  }
  const double lse_q = mq + log(WarpSum(sq));
  const double lse_p = mp + log(WarpSum(sp));
  const double lse_s = ms + log(WarpSum(ss));
  const float w = __double2float_rn(n);
  double kl = 0.0;
  for (int64_t k = lane; k < c; k += 32) {
    const double sk = static_cast<double>(Load(s, k));
    const double log_q = scale * sk - lse_q;
    const double log_p = scale * static_cast<double>(z[k]) - lse_p;
    const double p = exp(log_p);
    if (p > 0) kl += p * (log_p - log_q);  // xlogy: 0 log 0 = 0
    if (grad != nullptr) {
      // d/ds [alpha T^2 KL] = alpha T (q - p); d/ds CE = softmax(s) - 1_y.
      const double dkl = alpha * t * (exp(log_q) - p);
      const double dce = (1.0 - alpha) * (exp(sk - lse_s) - (k == y ? 1 : 0));
      StoreWeighted(grad, r * c + k, (dkl + dce) / n, w);
    }
  }
  kl = WarpSum(kl);
  if (lane == 0) {
    row_kl[r] = kl;
    row_ce[r] = lse_s - static_cast<double>(Load(s, y));
    row_correct[r] = arg == y ? 1.0 : 0.0;
  }
}

// One block of kFinalThreads: sums the row arrays and fills the slots.
// kind 0: cross-entropy (loss, correct); 1: distillation (kl, ce, correct).
__global__ void ClassifierFinalKernel(int kind, int64_t rows, double t,
                                      double alpha,
                                      const double* __restrict__ ws,
                                      double* __restrict__ slots) {
  __shared__ double sh[kFinalThreads];
  const int arrays = kind == 0 ? 2 : 3;
  double sums[3] = {0.0, 0.0, 0.0};
  for (int a = 0; a < arrays; ++a) {
    double acc = 0.0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
      acc += ws[2 + a * rows + r];
    }
    sums[a] = BlockSum(acc, sh);
  }
  if (threadIdx.x != 0 || ws[1] >= 0) return;  // a bad label: only [2], [3]
  const double n = ws[0];
  if (n == 0) return;  // every row ignored: all zero
  slots[0] = n;
  if (kind == 0) {
    slots[1] = n * (sums[0] / n);
    slots[4] = sums[0];
    slots[5] = sums[1];
  } else {
    const double loss = alpha * t * t * sums[0] / n + (1 - alpha) * sums[1] / n;
    slots[1] = n * loss;
    slots[4] = sums[0];
    slots[5] = sums[1];
    slots[6] = sums[2];
  }
}

absl::Status CheckOutput(const char* k, const losses::Output& out,
                         double* slots) {
  TY_RETURN_IF_ERROR(internal::CheckSizes(k, out.rows, out.cols));
  TY_RETURN_IF_ERROR(CheckActivationDType(k, out.dtype));
  TY_RETURN_IF_ERROR(internal::CheckPtr(k, "slots", slots));
  if (out.rows * out.cols > 0) {
    TY_RETURN_IF_ERROR(internal::CheckPtr(k, "output", out.data));
  }
  if (out.grad != nullptr && !out.weighted) {
    return absl::InvalidArgumentError(absl::StrCat(
        k, ": the gradient on a GPU is the weighted one (Output::weighted)"));
  }
  return absl::OkStatus();
}

// The output, the labels and the classes of a classifier loss.
absl::Status CheckClassifier(const char* k, const losses::Output& out,
                             const losses::Labels& labels, double* slots) {
  TY_RETURN_IF_ERROR(CheckOutput(k, out, slots));
  if (labels.dtype != DType::kInt32 && labels.dtype != DType::kInt64) {
    return absl::InvalidArgumentError(
        absl::StrCat(k, ": labels are ", DTypeName(labels.dtype),
                     ", expected int32 or int64"));
  }
  if (out.rows > 0) {
    TY_RETURN_IF_ERROR(internal::CheckPtr(k, "labels", labels.data));
  }
  if (out.cols < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(k, ": classes must be >= 1, got ", out.cols));
  }
  return absl::OkStatus();
}

// Checks the workspace and enqueues CountLabelsKernel into it: the first
// step of both classifier losses.
absl::Status CountLabels(const char* k, const losses::Output& out,
                         const losses::Labels& labels, void* workspace,
                         double* slots, Stream stream) {
  TY_RETURN_IF_ERROR(internal::CheckPtr(k, "workspace", workspace));
  CountLabelsKernel<<<1, kFinalThreads, 0, stream>>>(
      out.rows, out.cols, labels.data, labels.dtype == DType::kInt64,
      labels.ignore_index, static_cast<double*>(workspace), slots);
  CUDA_RETURN_IF_LAUNCH_ERROR("CountLabelsKernel");
  return absl::OkStatus();
}

unsigned RowBlocks(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

size_t MseWorkspaceBytes(int64_t, int64_t) {
  return kMseMaxBlocks * sizeof(double);
}

size_t ClassifierWorkspaceBytes(int64_t rows, int64_t) {
  return static_cast<size_t>(2 + 3 * (rows > 0 ? rows : 0)) * sizeof(double);
}

absl::Status MseLoss(const losses::Output& out, const float* target,
                     void* workspace, double* slots, Stream stream) {
  const char* k = "MseLoss";
  TY_RETURN_IF_ERROR(CheckOutput(k, out, slots));
  const int64_t n = out.rows * out.cols;
  if (n == 0) return absl::OkStatus();  // the zeroed slots are the answer
  TY_RETURN_IF_ERROR(internal::CheckPtr(k, "target", target));
  TY_RETURN_IF_ERROR(internal::CheckPtr(k, "workspace", workspace));
  int64_t blocks =
      (n + kThreads * kMseItemsPerThread - 1) / (kThreads * kMseItemsPerThread);
  if (blocks > kMseMaxBlocks) blocks = kMseMaxBlocks;
  double* partial = static_cast<double*>(workspace);
  const float w = static_cast<float>(out.rows);
  if (out.dtype == DType::kFloat32) {
    MsePartialKernel<float>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
            n, static_cast<const float*>(out.data), target,
            static_cast<float*>(out.grad), w, partial);
  } else {
    MsePartialKernel<bf16>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
            n, static_cast<const bf16*>(out.data), target,
            static_cast<bf16*>(out.grad), w, partial);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("MsePartialKernel");
  MseFinalKernel<<<1, kFinalThreads, 0, stream>>>(
      out.rows, n, static_cast<int>(blocks), partial, slots);
  CUDA_RETURN_IF_LAUNCH_ERROR("MseFinalKernel");
  return absl::OkStatus();
}

absl::Status CrossEntropyLoss(const losses::Output& out,
                              const losses::Labels& labels,
                              double label_smoothing, void* workspace,
                              double* slots, Stream stream) {
  const char* k = "CrossEntropyLoss";
  TY_RETURN_IF_ERROR(CheckClassifier(k, out, labels, slots));
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        k, ": label_smoothing must be in [0, 1], got ", label_smoothing));
  }
  if (out.rows == 0) return absl::OkStatus();
  TY_RETURN_IF_ERROR(CountLabels(k, out, labels, workspace, slots, stream));
  double* ws = static_cast<double*>(workspace);
  const bool wide = labels.dtype == DType::kInt64;
  const int64_t ignore_index = labels.ignore_index;
  if (out.dtype == DType::kFloat32) {
    CrossEntropyRowKernel<float><<<RowBlocks(out.rows), kThreads, 0, stream>>>(
        out.rows, out.cols, static_cast<const float*>(out.data), labels.data,
        wide, ignore_index, label_smoothing, static_cast<float*>(out.grad), ws);
  } else {
    CrossEntropyRowKernel<bf16><<<RowBlocks(out.rows), kThreads, 0, stream>>>(
        out.rows, out.cols, static_cast<const bf16*>(out.data), labels.data,
        wide, ignore_index, label_smoothing, static_cast<bf16*>(out.grad), ws);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("CrossEntropyRowKernel");
  ClassifierFinalKernel<<<1, kFinalThreads, 0, stream>>>(0, out.rows, 0, 0, ws,
                                                         slots);
  CUDA_RETURN_IF_LAUNCH_ERROR("ClassifierFinalKernel");
  return absl::OkStatus();
}

absl::Status DistillationLoss(const losses::Output& out, const float* teacher,
                              const losses::Labels& labels, double temperature,
                              double alpha, void* workspace, double* slots,
                              Stream stream) {
  const char* k = "DistillationLoss";
  TY_RETURN_IF_ERROR(CheckClassifier(k, out, labels, slots));
  if (!(temperature > 0) || !(alpha >= 0 && alpha <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(k, ": temperature must be > 0 and alpha in [0, 1], got ",
                     temperature, " and ", alpha));
  }
  if (out.rows == 0) return absl::OkStatus();
  TY_RETURN_IF_ERROR(internal::CheckPtr(k, "teacher", teacher));
  TY_RETURN_IF_ERROR(CountLabels(k, out, labels, workspace, slots, stream));
  double* ws = static_cast<double*>(workspace);
  const bool wide = labels.dtype == DType::kInt64;
  const int64_t ignore_index = labels.ignore_index;
  if (out.dtype == DType::kFloat32) {
    DistillationRowKernel<float><<<RowBlocks(out.rows), kThreads, 0, stream>>>(
        out.rows, out.cols, static_cast<const float*>(out.data), teacher,
        labels.data, wide, ignore_index, temperature, alpha,
        static_cast<float*>(out.grad), ws);
  } else {
    DistillationRowKernel<bf16><<<RowBlocks(out.rows), kThreads, 0, stream>>>(
        out.rows, out.cols, static_cast<const bf16*>(out.data), teacher,
        labels.data, wide, ignore_index, temperature, alpha,
        static_cast<bf16*>(out.grad), ws);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("DistillationRowKernel");
  ClassifierFinalKernel<<<1, kFinalThreads, 0, stream>>>(
      1, out.rows, temperature, alpha, ws, slots);
  CUDA_RETURN_IF_LAUNCH_ERROR("ClassifierFinalKernel");
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace trainyard
