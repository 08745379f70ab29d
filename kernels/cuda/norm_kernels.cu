// Kernels first, then the launchers of norm_kernels.h.
#include "kernels/cuda/cuda_math.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/norm_kernels.h"

namespace trainyard {
namespace gpu {
namespace {

using internal::Load;
using internal::Store;
using internal::WarpSum;
using bf16 = __nv_bfloat16;

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = 32 * kWarpsPerBlock;

__device__ __forceinline__ int64_t WarpRow() {
  return blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
}

// RMS = true: RMSNorm (no mean, no bias).
template <bool RMS, typename T>
__global__ void NormForwardKernel(int64_t rows, int64_t cols,
                                  const T* __restrict__ x,
                                  const float* __restrict__ w,
                                  const float* __restrict__ b, float eps,
                                  T* __restrict__ y, float* __restrict__ mean,
                                  float* __restrict__ rstd) {
  const int64_t r = WarpRow();
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const T* xr = x + r * cols;
  float mu = 0.0f;
  if (!RMS) {
    float s = 0.0f;
    for (int64_t c = lane; c < cols; c += 32) s += Load(xr, c);
    mu = WarpSum(s) / static_cast<float>(cols);
  }
  float ss = 0.0f;
  for (int64_t c = lane; c < cols; c += 32) {
    const float d = Load(xr, c) - mu;
    ss += d * d;
  }
  const float rs = 1.0f / sqrtf(WarpSum(ss) / static_cast<float>(cols) + eps);
  for (int64_t c = lane; c < cols; c += 32) {
    float v = (Load(xr, c) - mu) * rs * w[c];
    if (b != nullptr) v += b[c];
    Store(y, r * cols + c, v);
  }
  if (lane == 0) {
    if (!RMS) mean[r] = mu;
    rstd[r] = rs;
  }
}

template <bool RMS, typename T>
__global__ void NormBackwardInputKernel(
    int64_t rows, int64_t cols, const T* __restrict__ x,
    const float* __restrict__ w, const float* __restrict__ mean,
    const float* __restrict__ rstd, const T* __restrict__ dy,
    const T* __restrict__ residual, T* __restrict__ dx) {
  const int64_t r = WarpRow();
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t base = r * cols;
  const float mu = RMS ? 0.0f : mean[r];
  const float rs = rstd[r];
  float sum_g = 0.0f, sum_gx = 0.0f;  // sums of g and g * xhat
  for (int64_t c = lane; c < cols; c += 32) {
    const float g = Load(dy, base + c) * w[c];
    const float xhat = (Load(x, base + c) - mu) * rs;
    sum_g += g;
    sum_gx += g * xhat;
  }
  const float inv_n = 1.0f / static_cast<float>(cols);
  const float mean_g = RMS ? 0.0f : WarpSum(sum_g) * inv_n;
  const float mean_gx = WarpSum(sum_gx) * inv_n;
  for (int64_t c = lane; c < cols; c += 32) {
    const float g = Load(dy, base + c) * w[c];
    const float xhat = (Load(x, base + c) - mu) * rs;
    float v = rs * (g - mean_g - xhat * mean_gx);
    if (residual != nullptr) v += Load(residual, base + c);
    Store(dx, base + c, v);
  }
}

// Parameter gradients in two deterministic stages. Stage 1: a block of
// kParamCols x kParamRowLanes threads sums a chunk of kRowsPerChunk rows for
// kParamCols columns (each thread every kParamRowLanes-th row, in order;
// then the lanes in order), into partial[chunk][col]. Stage 2: one thread
// per column adds the chunks in order. The split depends only on the shape:
// the same bits every run.
constexpr int kParamCols = 32;
constexpr int kParamRowLanes = 8;
constexpr int64_t kRowsPerChunk = 256;

int64_t ParamChunks(int64_t rows) {
  return rows <= 0 ? 1 : (rows + kRowsPerChunk - 1) / kRowsPerChunk;
}

template <bool RMS, typename T>
__global__ void NormParamsPartialKernel(int64_t rows, int64_t cols,
                                        const T* __restrict__ x,
                                        const float* __restrict__ mean,
                                        const float* __restrict__ rstd,
                                        const T* __restrict__ dy,
                                        double* __restrict__ partial_w,
                                        double* __restrict__ partial_b) {
  __shared__ double sw_sh[kParamRowLanes][kParamCols];
  __shared__ double sb_sh[kParamRowLanes][kParamCols];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = blockIdx.x * int64_t{kParamCols} + tx;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * kRowsPerChunk;
  const int64_t r1 = min(rows, r0 + kRowsPerChunk);
  double sw = 0.0, sb = 0.0;
  if (c < cols) {
    for (int64_t r = r0 + ty; r < r1; r += kParamRowLanes) {
      const float g = Load(dy, r * cols + c);
      const float xhat =
          (Load(x, r * cols + c) - (RMS ? 0.0f : mean[r])) * rstd[r];
      sw += static_cast<double>(g) * xhat;
      sb += g;
    }
  }
  sw_sh[ty][tx] = sw;
  sb_sh[ty][tx] = sb;
  __syncthreads();
  if (ty == 0 && c < cols) {
    double a = 0.0, b = 0.0;
    for (int i = 0; i < kParamRowLanes; ++i) {
      a += sw_sh[i][tx];
      b += sb_sh[i][tx];
    }
    partial_w[chunk * cols + c] = a;
    partial_b[chunk * cols + c] = b;
  }
}

__global__ void NormParamsFinalKernel(int64_t chunks, int64_t cols,
                                      const double* __restrict__ partial_w,
                                      const double* __restrict__ partial_b,
                                      bool accumulate, float* __restrict__ dw,
                                      float* __restrict__ db) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= cols) return;
  double sw = 0.0, sb = 0.0;
  for (int64_t k = 0; k < chunks; ++k) {
    sw += partial_w[k * cols + c];
    sb += partial_b[k * cols + c];
  }
  dw[c] = accumulate ? static_cast<float>(dw[c] + sw) : static_cast<float>(sw);
  if (db != nullptr) {
    db[c] =
        accumulate ? static_cast<float>(db[c] + sb) : static_cast<float>(sb);
  }
}

absl::Status CheckArgs(const char* kernel, int64_t rows, int64_t cols,
                       const void* a, const void* b, const void* c) {
  TY_RETURN_IF_ERROR(internal::CheckSizes(kernel, rows, cols));
  if (rows > 0 && cols == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": cols must be > 0"));
  }
  if (rows > 0 && (a == nullptr || b == nullptr || c == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": a required pointer is null"));
  }
  return absl::OkStatus();
}

unsigned RowGrid(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}
unsigned ColGrid(int64_t cols) {
  return static_cast<unsigned>((cols + kThreads - 1) / kThreads);
}

template <bool RMS>
absl::Status Forward(DType dtype, int64_t rows, int64_t cols, const void* x,
                     const float* w, const float* b, float eps, void* y,
                     float* mean, float* rstd, Stream stream) {
  if (dtype == DType::kFloat32) {
    NormForwardKernel<RMS, float><<<RowGrid(rows), kThreads, 0, stream>>>(
        rows, cols, static_cast<const float*>(x), w, b, eps,
        static_cast<float*>(y), mean, rstd);
  } else {
    NormForwardKernel<RMS, bf16><<<RowGrid(rows), kThreads, 0, stream>>>(
        rows, cols, static_cast<const bf16*>(x), w, b, eps,
        static_cast<bf16*>(y), mean, rstd);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("NormForwardKernel");
  return absl::OkStatus();
}

template <bool RMS>
absl::Status BackwardInput(DType dtype, int64_t rows, int64_t cols,
                           const void* x, const float* w, const float* mean,
                           const float* rstd, const void* dy,
                           const void* residual, void* dx, Stream stream) {
  if (dtype == DType::kFloat32) {
    NormBackwardInputKernel<RMS, float><<<RowGrid(rows), kThreads, 0, stream>>>(
        rows, cols, static_cast<const float*>(x), w, mean, rstd,
        static_cast<const float*>(dy), static_cast<const float*>(residual),
        static_cast<float*>(dx));
  } else {
    NormBackwardInputKernel<RMS, bf16><<<RowGrid(rows), kThreads, 0, stream>>>(
        rows, cols, static_cast<const bf16*>(x), w, mean, rstd,
        static_cast<const bf16*>(dy), static_cast<const bf16*>(residual),
        static_cast<bf16*>(dx));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("NormBackwardInputKernel");
  return absl::OkStatus();
}

template <bool RMS>
absl::Status BackwardParams(DType dtype, int64_t rows, int64_t cols,
                            const void* x, const float* mean, const float* rstd,
                            const void* dy, bool accumulate, float* dw,
                            float* db, void* workspace, Stream stream) {
  const int64_t chunks = ParamChunks(rows);
  double* partial_w = static_cast<double*>(workspace);
  double* partial_b = partial_w + chunks * cols;
  const dim3 grid(static_cast<unsigned>((cols + kParamCols - 1) / kParamCols),
                  static_cast<unsigned>(chunks));
  const dim3 block(kParamCols, kParamRowLanes);
  if (dtype == DType::kFloat32) {
    NormParamsPartialKernel<RMS, float><<<grid, block, 0, stream>>>(
        rows, cols, static_cast<const float*>(x), mean, rstd,
        static_cast<const float*>(dy), partial_w, partial_b);
  } else {
    NormParamsPartialKernel<RMS, bf16><<<grid, block, 0, stream>>>(
        rows, cols, static_cast<const bf16*>(x), mean, rstd,
        static_cast<const bf16*>(dy), partial_w, partial_b);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("NormParamsPartialKernel");
  NormParamsFinalKernel<<<ColGrid(cols), kThreads, 0, stream>>>(
      chunks, cols, partial_w, partial_b, accumulate, dw, db);
  CUDA_RETURN_IF_LAUNCH_ERROR("NormParamsFinalKernel");
  return absl::OkStatus();
}

}  // namespace

absl::Status LayerNormForward(DType dtype, int64_t rows, int64_t cols,
                              const void* x, const float* weight,
                              const float* bias, float eps, void* y,
                              float* mean, float* rstd, Stream stream) {
  TY_RETURN_IF_ERROR(CheckActivationDType("LayerNormForward", dtype));
  TY_RETURN_IF_ERROR(CheckArgs("LayerNormForward", rows, cols, x, weight, y));
  TY_RETURN_IF_ERROR(CheckArgs("LayerNormForward", rows, cols, mean, rstd, y));
  if (rows == 0) return absl::OkStatus();
  return Forward<false>(dtype, rows, cols, x, weight, bias, eps, y, mean, rstd,
                        stream);
}

absl::Status LayerNormBackwardInput(DType dtype, int64_t rows, int64_t cols,
                                    const void* x, const float* weight,
                                    const float* mean, const float* rstd,
                                    const void* dy, const void* residual,
                                    void* dx, Stream stream) {
  TY_RETURN_IF_ERROR(CheckActivationDType("LayerNormBackwardInput", dtype));
  TY_RETURN_IF_ERROR(
      CheckArgs("LayerNormBackwardInput", rows, cols, x, weight, dx));
  TY_RETURN_IF_ERROR(
      CheckArgs("LayerNormBackwardInput", rows, cols, mean, rstd, dy));
  if (rows == 0) return absl::OkStatus();
  return BackwardInput<false>(dtype, rows, cols, x, weight, mean, rstd, dy,
                              residual, dx, stream);
}

size_t NormParamsWorkspaceBytes(int64_t rows, int64_t cols) {
  return static_cast<size_t>(2 * ParamChunks(rows) * (cols > 0 ? cols : 0)) *
         sizeof(double);
}

absl::Status LayerNormBackwardParams(DType dtype, int64_t rows, int64_t cols,
                                     const void* x, const float* mean,
                                     const float* rstd, const void* dy,
                                     bool accumulate, float* d_weight,
                                     float* d_bias, void* workspace,
                                     Stream stream) {
  TY_RETURN_IF_ERROR(CheckActivationDType("LayerNormBackwardParams", dtype));
  TY_RETURN_IF_ERROR(
      internal::CheckSizes("LayerNormBackwardParams", rows, cols));
  if (cols == 0) return absl::OkStatus();
  TY_RETURN_IF_ERROR(
      internal::CheckPtr("LayerNormBackwardParams", "d_weight", d_weight));
  if (rows > 0) {
    TY_RETURN_IF_ERROR(
        CheckArgs("LayerNormBackwardParams", rows, cols, x, mean, rstd));
    TY_RETURN_IF_ERROR(internal::CheckPtr("LayerNormBackwardParams", "dy", dy));
  }
  TY_RETURN_IF_ERROR(
      internal::CheckPtr("LayerNormBackwardParams", "workspace", workspace));
  return BackwardParams<false>(dtype, rows, cols, x, mean, rstd, dy, accumulate,
                               d_weight, d_bias, workspace, stream);
}

absl::Status RmsNormForward(DType dtype, int64_t rows, int64_t cols,
                            const void* x, const float* weight, float eps,
                            void* y, float* rstd, Stream stream) {
  TY_RETURN_IF_ERROR(CheckActivationDType("RmsNormForward", dtype));
  TY_RETURN_IF_ERROR(CheckArgs("RmsNormForward", rows, cols, x, weight, y));
  TY_RETURN_IF_ERROR(CheckArgs("RmsNormForward", rows, cols, rstd, rstd, y));
  if (rows == 0) return absl::OkStatus();
  return Forward<true>(dtype, rows, cols, x, weight, nullptr, eps, y, nullptr,
                       rstd, stream);
}

absl::Status RmsNormBackwardInput(DType dtype, int64_t rows, int64_t cols,
                                  const void* x, const float* weight,
                                  const float* rstd, const void* dy,
                                  const void* residual, void* dx,
                                  Stream stream) {
  TY_RETURN_IF_ERROR(CheckActivationDType("RmsNormBackwardInput", dtype));
  TY_RETURN_IF_ERROR(
      CheckArgs("RmsNormBackwardInput", rows, cols, x, weight, dx));
  TY_RETURN_IF_ERROR(
      CheckArgs("RmsNormBackwardInput", rows, cols, rstd, rstd, dy));
  if (rows == 0) return absl::OkStatus();
  return BackwardInput<true>(dtype, rows, cols, x, weight, nullptr, rstd, dy,
                             residual, dx, stream);
}

absl::Status RmsNormBackwardParams(DType dtype, int64_t rows, int64_t cols,
                                   const void* x, const float* rstd,
                                   const void* dy, bool accumulate,
                                   float* d_weight, void* workspace,
                                   Stream stream) {
  TY_RETURN_IF_ERROR(CheckActivationDType("RmsNormBackwardParams", dtype));
  TY_RETURN_IF_ERROR(internal::CheckSizes("RmsNormBackwardParams", rows, cols));
  if (cols == 0) return absl::OkStatus();
  TY_RETURN_IF_ERROR(
      internal::CheckPtr("RmsNormBackwardParams", "d_weight", d_weight));
  if (rows > 0) {
    TY_RETURN_IF_ERROR(
        CheckArgs("RmsNormBackwardParams", rows, cols, x, rstd, dy));
  }
  TY_RETURN_IF_ERROR(
      internal::CheckPtr("RmsNormBackwardParams", "workspace", workspace));
  return BackwardParams<true>(dtype, rows, cols, x, nullptr, rstd, dy,
                              accumulate, d_weight, nullptr, workspace, stream);
}

}  // namespace gpu
}  // namespace trainyard
