// Kernels first, then the launchers of loss_kernels.h.
#include <cfloat>

#include "core/cuda_status.h"
#include "kernels/cuda/cuda_math.cuh"
#include "kernels/cuda/loss_kernels.h"

namespace trainyard {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kMseBlocks = 128;

// Fixed tree over a block's shared array of kThreads doubles.
__device__ double BlockSum(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

__global__ void MsePartialKernel(int64_t n, const float* __restrict__ out,
                                 const float* __restrict__ target,
                                 float* __restrict__ grad,
                                 double* __restrict__ partial) {
  __shared__ double sh[kThreads];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n;
       i += int64_t{kMseBlocks} * kThreads) {
    const double d = static_cast<double>(out[i]) - target[i];
    acc += d * d;
    if (grad != nullptr) grad[i] = static_cast<float>(2.0 * d / n);
  }
  const double s = BlockSum(acc, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void MseFinalKernel(int64_t rows, int64_t n,
                               const double* __restrict__ partial,
                               LossResult* result) {
  __shared__ double sh[kThreads];
  const double s =
      BlockSum(threadIdx.x < kMseBlocks ? partial[threadIdx.x] : 0.0, sh);
  if (threadIdx.x == 0) {
    result->loss = n > 0 ? s / n : 0.0;
    result->loss_weight = n > 0 ? static_cast<double>(rows) : 0.0;
    result->loss_sum = s;
    result->correct = 0;
    result->bad_row = -1;
  }
}

// One block: counts valid rows and finds the first bad label.
// ws[0] = count (as double), ws[1] = bad row (as double, -1 if none).
__global__ void XentCountKernel(int64_t rows, int64_t classes,
                                const int64_t* __restrict__ labels,
                                int64_t ignore_index, double* __restrict__ ws) {
  __shared__ double sh[kThreads];
  __shared__ unsigned long long bad;
  if (threadIdx.x == 0) bad = ~0ull;
  __syncthreads();
  double count = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    const int64_t y = labels[r];
    if (y == ignore_index) continue;
    if (y < 0 || y >= classes) {
      atomicMin(&bad, static_cast<unsigned long long>(r));  // integer: exact
    } else {
      count += 1.0;
    }
  }
  const double total = BlockSum(count, sh);
  if (threadIdx.x == 0) {
    ws[0] = total;
    ws[1] = bad == ~0ull ? -1.0 : static_cast<double>(bad);
  }
}

// One block per row. ws[2 + r] = row loss; ws[2 + rows + r] = correct (0/1).
__global__ void XentRowKernel(int64_t rows, int64_t classes,
                              const float* __restrict__ logits,
                              const int64_t* __restrict__ labels,
                              int64_t ignore_index, double eps,
                              float* __restrict__ grad,
                              double* __restrict__ ws) {
  __shared__ double sh[kThreads];
  __shared__ float sh_max[kThreads];
  __shared__ int64_t sh_arg[kThreads];
  const int64_t r = blockIdx.x;
  const int64_t y = labels[r];
  const float* row = logits + r * classes;
  const bool valid = y != ignore_index && y >= 0 && y < classes;
  if (!valid) {
    if (grad != nullptr) {
      for (int64_t k = threadIdx.x; k < classes; k += kThreads) {
        grad[r * classes + k] = 0.0f;
      }
    }
    if (threadIdx.x == 0) {
      ws[2 + r] = 0.0;
      ws[2 + rows + r] = 0.0;
    }
    return;
  }
  // Max and first argmax.
  float best = -FLT_MAX;
  int64_t arg = classes;
  for (int64_t k = threadIdx.x; k < classes; k += kThreads) {
    const float v = row[k];
    if (arg == classes || v > best) {
      best = v;
      arg = k;
    }
  }
  sh_max[threadIdx.x] = best;
  sh_arg[threadIdx.x] = arg;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      const float ov = sh_max[threadIdx.x + w];
      const int64_t oa = sh_arg[threadIdx.x + w];
      if (oa < classes &&
          (sh_arg[threadIdx.x] == classes || ov > sh_max[threadIdx.x] ||
           (ov == sh_max[threadIdx.x] && oa < sh_arg[threadIdx.x]))) {
        sh_max[threadIdx.x] = ov;
        sh_arg[threadIdx.x] = oa;
      }
    }
    __syncthreads();
  }
  const double mx = sh_max[0];
  const int64_t argmax = sh_arg[0];
  __syncthreads();
  double se = 0.0, sum_x = 0.0;
  for (int64_t k = threadIdx.x; k < classes; k += kThreads) {
    const double v = row[k];
    se += exp(v - mx);
    sum_x += v;
  }
  se = BlockSum(se, sh);
  sum_x = BlockSum(sum_x, sh);
  const double lse = mx + log(se);  // log p[k] = x_k - lse
  const double n = ws[0];
  if (grad != nullptr) {
    for (int64_t k = threadIdx.x; k < classes; k += kThreads) {
      const double logp = row[k] - lse;
      const double target = (k == y ? 1.0 - eps : 0.0) + eps / classes;
      grad[r * classes + k] = static_cast<float>((exp(logp) - target) / n);
    }
  }
  if (threadIdx.x == 0) {
    const double nll = lse - row[y];
    const double smooth = classes * lse - sum_x;  // sum_c -log p[c]
    ws[2 + r] = (1.0 - eps) * nll + eps * smooth / classes;
    ws[2 + rows + r] = argmax == y ? 1.0 : 0.0;
  }
}

__global__ void XentFinalKernel(int64_t rows, const double* __restrict__ ws,
                                LossResult* result) {
  __shared__ double sh[kThreads];
  double loss = 0.0, correct = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    loss += ws[2 + r];
    correct += ws[2 + rows + r];
  }
  loss = BlockSum(loss, sh);
  correct = BlockSum(correct, sh);
  if (threadIdx.x == 0) {
    const double n = ws[0];
    result->loss = n > 0 ? loss / n : 0.0;
    result->loss_weight = n;
    result->loss_sum = loss;
    result->correct = static_cast<int64_t>(correct);
    result->bad_row = static_cast<int64_t>(ws[1]);
  }
}

}  // namespace

size_t LossWorkspaceBytes(int64_t rows) {
  const int64_t doubles = rows * 2 + 2;
  return static_cast<size_t>(doubles < kMseBlocks ? kMseBlocks : doubles) *
         sizeof(double);
}

absl::Status MseLoss(int64_t rows, int64_t cols, const float* out,
                     const float* target, float* grad, void* workspace,
                     LossResult* result, Stream stream) {
  TY_RETURN_IF_ERROR(internal::CheckSizes("MseLoss", rows, cols));
  TY_RETURN_IF_ERROR(internal::CheckPtr("MseLoss", "workspace", workspace));
  TY_RETURN_IF_ERROR(internal::CheckPtr("MseLoss", "result", result));
  const int64_t n = rows * cols;
  if (n > 0) {
    TY_RETURN_IF_ERROR(internal::CheckPtr("MseLoss", "out", out));
    TY_RETURN_IF_ERROR(internal::CheckPtr("MseLoss", "target", target));
  }
  double* partial = static_cast<double*>(workspace);
  MsePartialKernel<<<kMseBlocks, kThreads, 0, stream>>>(n, out, target, grad,
                                                        partial);
  CUDA_RETURN_IF_LAUNCH_ERROR("MsePartialKernel");
  MseFinalKernel<<<1, kThreads, 0, stream>>>(rows, n, partial, result);
  CUDA_RETURN_IF_LAUNCH_ERROR("MseFinalKernel");
  return absl::OkStatus();
}

absl::Status SoftmaxCrossEntropyLoss(int64_t rows, int64_t classes,
                                     const float* logits, const int64_t* labels,
                                     int64_t ignore_index,
                                     double label_smoothing, float* grad,
                                     void* workspace, LossResult* result,
                                     Stream stream) {
  const char* k = "SoftmaxCrossEntropyLoss";
  TY_RETURN_IF_ERROR(internal::CheckSizes(k, rows, classes));
  if (classes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(k, ": classes must be >= 1, got ", classes));
  }
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        k, ": label_smoothing must be in [0, 1], got ", label_smoothing));
  }
  TY_RETURN_IF_ERROR(internal::CheckPtr(k, "workspace", workspace));
  TY_RETURN_IF_ERROR(internal::CheckPtr(k, "result", result));
  if (rows > 0) {
    TY_RETURN_IF_ERROR(internal::CheckPtr(k, "logits", logits));
    TY_RETURN_IF_ERROR(internal::CheckPtr(k, "labels", labels));
  }
  double* ws = static_cast<double*>(workspace);
  XentCountKernel<<<1, kThreads, 0, stream>>>(rows, classes, labels,
                                              ignore_index, ws);
  CUDA_RETURN_IF_LAUNCH_ERROR("XentCountKernel");
  if (rows > 0) {
    XentRowKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        rows, classes, logits, labels, ignore_index, label_smoothing, grad, ws);
    CUDA_RETURN_IF_LAUNCH_ERROR("XentRowKernel");
  }
  XentFinalKernel<<<1, kThreads, 0, stream>>>(rows, ws, result);
  CUDA_RETURN_IF_LAUNCH_ERROR("XentFinalKernel");
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace trainyard
