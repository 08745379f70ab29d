// Kernels first, then the launchers of elementwise_kernels.h.
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_math.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise_kernels.h"

namespace trainyard {
namespace gpu {
namespace {

using internal::GridFor;
using internal::GridStrideBegin;
using internal::GridStrideStep;
using internal::Load;
using internal::Store;
using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

template <Activation A>
__device__ __forceinline__ float Act(float x) {
  // NaN passes through, as in torch.relu and the CPU kernel.
  if (A == Activation::kRelu) return x <= 0.0f ? 0.0f : x;
  if (A == Activation::kGelu) return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
  const float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

template <Activation A>
__device__ __forceinline__ float ActGrad(float x) {
  if (A == Activation::kRelu) return x > 0.0f ? 1.0f : 0.0f;
  if (A == Activation::kGelu) {
    return 0.5f * (1.0f + erff(x * kInvSqrt2)) +
           x * kInvSqrt2Pi * expf(-0.5f * x * x);
  }
  const float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
  const float t = tanhf(u);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

__device__ __forceinline__ float Sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

template <Activation A, typename T>
__global__ void BiasActForwardKernel(int64_t rows, int64_t cols,
                                     const float* __restrict__ bias,
                                     T* __restrict__ pre, T* __restrict__ out) {
  const int64_t n = rows * cols;
  for (int64_t i = GridStrideBegin(); i < n; i += GridStrideStep()) {
    float x = Load(pre, i);
    if (bias != nullptr) {
      x += bias[i % cols];
      Store(pre, i, x);
      x = Load(pre, i);  // the stored (rounded) value, as backward sees it
    }
    Store(out, i, Act<A>(x));
  }
}

template <Activation A, typename T>
__global__ void ActBackwardKernel(int64_t n, const T* __restrict__ pre,
                                  const T* d_out, T* d_pre) {
  for (int64_t i = GridStrideBegin(); i < n; i += GridStrideStep()) {
    Store(d_pre, i, Load(d_out, i) * ActGrad<A>(Load(pre, i)));
  }
}

template <typename T>
__global__ void BiasSwigluForwardKernel(int64_t rows, int64_t ffn,
                                        const float* __restrict__ bias,
                                        T* __restrict__ pre,
                                        T* __restrict__ out) {
  const int64_t n = rows * ffn;
  for (int64_t i = GridStrideBegin(); i < n; i += GridStrideStep()) {
    const int64_t r = i / ffn, c = i % ffn;
    const int64_t ia = r * 2 * ffn + c, ib = ia + ffn;
    float a = Load(pre, ia), b = Load(pre, ib);
    if (bias != nullptr) {
      Store(pre, ia, a + bias[c]);
      Store(pre, ib, b + bias[c + ffn]);
      a = Load(pre, ia);
      b = Load(pre, ib);
    }
    Store(out, i, a * Sigmoid(a) * b);
  }
}

template <typename T>
__global__ void SwigluBackwardKernel(int64_t rows, int64_t ffn,
                                     const T* __restrict__ pre,
                                     const T* __restrict__ d_out,
                                     T* __restrict__ d_pre) {
  const int64_t n = rows * ffn;
  for (int64_t i = GridStrideBegin(); i < n; i += GridStrideStep()) {
    const int64_t r = i / ffn, c = i % ffn;
    const int64_t ia = r * 2 * ffn + c, ib = ia + ffn;
    const float a = Load(pre, ia), b = Load(pre, ib), g = Load(d_out, i);
    const float s = Sigmoid(a);
    const float silu = a * s;
    Store(d_pre, ia, g * b * (s * (1.0f + a * (1.0f - s))));
    Store(d_pre, ib, g * silu);
  }
}

template <typename T>
__global__ void AddBiasResidualKernel(int64_t rows, int64_t cols,
                                      const float* __restrict__ bias,
                                      const T* __restrict__ residual,
                                      T* __restrict__ y) {
  const int64_t n = rows * cols;
  for (int64_t i = GridStrideBegin(); i < n; i += GridStrideStep()) {
    float v = Load(y, i);
    if (bias != nullptr) v += bias[i % cols];
    if (residual != nullptr) v += Load(residual, i);
    Store(y, i, v);
  }
}

// Block: kColTile columns x kRowLanes row lanes. Lane l of column c sums
// rows l, l + kRowLanes, ... in increasing order (double); the lane sums
// are then added in lane order. The order depends only on `rows`.
constexpr int kColTile = 32;
constexpr int kRowLanes = 16;

template <typename T>
__global__ void ColumnSumsKernel(int64_t rows, int64_t cols,
                                 const T* __restrict__ x, bool accumulate,
                                 float* __restrict__ out) {
  __shared__ double partial[kRowLanes][kColTile];
  const int tx = threadIdx.x % kColTile;
  const int lane = threadIdx.x / kColTile;
  // Grid-stride over column tiles; the loop condition is the same for every
  // thread of a block, so all of them reach the barriers.
  for (int64_t tile = blockIdx.x; tile * kColTile < cols; tile += gridDim.x) {
    const int64_t c = tile * kColTile + tx;
    double s = 0.0;
    if (c < cols) {
      for (int64_t r = lane; r < rows; r += kRowLanes) {
        s += Load(x, r * cols + c);
      }
    }
    partial[lane][tx] = s;
    __syncthreads();
    if (lane == 0 && c < cols) {
      double total = partial[0][tx];
      for (int l = 1; l < kRowLanes; ++l) total += partial[l][tx];
      out[c] = accumulate ? static_cast<float>(out[c] + total)
                          : static_cast<float>(total);
    }
    __syncthreads();  // `partial` is rewritten for the next tile
  }
}

// float16 reads for CastKernel (cuda_math.cuh has float and bfloat16).
// __half2float is exact (every half is a float); a NaN becomes the
// canonical 0x7FFFFFFF (seen on an H200 with CUDA 13.0).
__device__ __forceinline__ float Load(const __half* p, int64_t i) {
  return __half2float(p[i]);
}

// dst[i] = src[i] through float32: widening is exact, narrowing to
// bfloat16 rounds to nearest even (any NaN -> 0x7FFF).
template <typename From, typename To>
__global__ void CastKernel(int64_t n, const From* __restrict__ src,
                           To* __restrict__ dst) {
  for (int64_t i = GridStrideBegin(); i < n; i += GridStrideStep()) {
    Store(dst, i, Load(src, i));
  }
}

template <Activation A>
absl::Status LaunchBiasAct(DType dtype, int64_t rows, int64_t cols,
                           const float* bias, void* pre, void* out,
                           Stream stream) {
  const unsigned grid = GridFor(rows * cols, kThreads);
  if (dtype == DType::kFloat32) {
    BiasActForwardKernel<A, float><<<grid, kThreads, 0, stream>>>(
        rows, cols, bias, static_cast<float*>(pre), static_cast<float*>(out));
  } else {
    BiasActForwardKernel<A, bf16><<<grid, kThreads, 0, stream>>>(
        rows, cols, bias, static_cast<bf16*>(pre), static_cast<bf16*>(out));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("BiasActForwardKernel");
  return absl::OkStatus();
}

template <Activation A>
absl::Status LaunchActBackward(DType dtype, int64_t n, const void* pre,
                               const void* d_out, void* d_pre, Stream stream) {
  const unsigned grid = GridFor(n, kThreads);
  if (dtype == DType::kFloat32) {
    ActBackwardKernel<A, float><<<grid, kThreads, 0, stream>>>(
        n, static_cast<const float*>(pre), static_cast<const float*>(d_out),
        static_cast<float*>(d_pre));
  } else {
    ActBackwardKernel<A, bf16><<<grid, kThreads, 0, stream>>>(
        n, static_cast<const bf16*>(pre), static_cast<const bf16*>(d_out),
        static_cast<bf16*>(d_pre));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("ActBackwardKernel");
  return absl::OkStatus();
}

// kRelu, kGelu and kGeluTanh have element-wise kernels here; SwiGLU has its
// own launchers (its pre-activation is twice as wide).
absl::Status CheckAct(const char* kernel, Activation act) {
  switch (act) {
    case Activation::kRelu:
    case Activation::kGelu:
    case Activation::kGeluTanh:
      return absl::OkStatus();
    case Activation::kSwiglu:
      return absl::InvalidArgumentError(
          absl::StrCat(kernel,
                       ": activation swiglu is not supported here (use "
                       "BiasSwigluForward / SwigluBackward)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(kernel, ": unknown activation ", static_cast<int>(act)));
}

// The checked launch of CastKernel<From, To> for the launcher `name`.
template <typename From, typename To>
absl::Status LaunchCast(const char* name, int64_t n, const void* src, void* dst,
                        Stream stream) {
  TY_RETURN_IF_ERROR(internal::CheckSizes(name, n, 0));
  if (n == 0) return absl::OkStatus();
  TY_RETURN_IF_ERROR(internal::CheckPtr(name, "src", src));
  TY_RETURN_IF_ERROR(internal::CheckPtr(name, "dst", dst));
  CastKernel<From, To><<<GridFor(n, kThreads), kThreads, 0, stream>>>(
      n, static_cast<const From*>(src), static_cast<To*>(dst));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return CudaErrorToStatus(err, "launch of CastKernel", __FILE__, __LINE__,
                             name);
  }
  return absl::OkStatus();
}

}  // namespace

using internal::CheckPtr;
using internal::CheckSizes;

absl::Status BiasActivationForward(Activation act, DType dtype, int64_t rows,
                                   int64_t cols, const float* bias, void* pre,
                                   void* out, Stream stream) {
  TY_RETURN_IF_ERROR(CheckActivationDType("BiasActivationForward", dtype));
  TY_RETURN_IF_ERROR(CheckAct("BiasActivationForward", act));
  TY_RETURN_IF_ERROR(CheckSizes("BiasActivationForward", rows, cols));
  if (rows * cols == 0) return absl::OkStatus();
  TY_RETURN_IF_ERROR(CheckPtr("BiasActivationForward", "pre", pre));
  TY_RETURN_IF_ERROR(CheckPtr("BiasActivationForward", "out", out));
  switch (act) {
    case Activation::kRelu:
      return LaunchBiasAct<Activation::kRelu>(dtype, rows, cols, bias, pre, out,
                                              stream);
    case Activation::kGelu:
      return LaunchBiasAct<Activation::kGelu>(dtype, rows, cols, bias, pre, out,
                                              stream);
    case Activation::kGeluTanh:
      return LaunchBiasAct<Activation::kGeluTanh>(dtype, rows, cols, bias, pre,
                                                  out, stream);
    case Activation::kSwiglu:
      break;  // rejected by CheckAct
  }
  return absl::InternalError("BiasActivationForward: unreachable");
}

absl::Status ActivationBackward(Activation act, DType dtype, int64_t n,
                                const void* pre, const void* d_out, void* d_pre,
                                Stream stream) {
  TY_RETURN_IF_ERROR(CheckActivationDType("ActivationBackward", dtype));
  TY_RETURN_IF_ERROR(CheckAct("ActivationBackward", act));
  TY_RETURN_IF_ERROR(CheckSizes("ActivationBackward", n, 0));
  if (n == 0) return absl::OkStatus();
  TY_RETURN_IF_ERROR(CheckPtr("ActivationBackward", "pre", pre));
  TY_RETURN_IF_ERROR(CheckPtr("ActivationBackward", "d_out", d_out));
  TY_RETURN_IF_ERROR(CheckPtr("ActivationBackward", "d_pre", d_pre));
  switch (act) {
    case Activation::kRelu:
      return LaunchActBackward<Activation::kRelu>(dtype, n, pre, d_out, d_pre,
                                                  stream);
    case Activation::kGelu:
      return LaunchActBackward<Activation::kGelu>(dtype, n, pre, d_out, d_pre,
                                                  stream);
    case Activation::kGeluTanh:
      return LaunchActBackward<Activation::kGeluTanh>(dtype, n, pre, d_out,
                                                      d_pre, stream);
    case Activation::kSwiglu:
      break;  // rejected by CheckAct
  }
  return absl::InternalError("ActivationBackward: unreachable");
}

absl::Status BiasSwigluForward(DType dtype, int64_t rows, int64_t ffn,
                               const float* bias, void* pre, void* out,
                               Stream stream) {
  TY_RETURN_IF_ERROR(CheckActivationDType("BiasSwigluForward", dtype));
  TY_RETURN_IF_ERROR(CheckSizes("BiasSwigluForward", rows, ffn));
  if (rows * ffn == 0) return absl::OkStatus();
  TY_RETURN_IF_ERROR(CheckPtr("BiasSwigluForward", "pre", pre));
  TY_RETURN_IF_ERROR(CheckPtr("BiasSwigluForward", "out", out));
  const unsigned grid = GridFor(rows * ffn, kThreads);
  if (dtype == DType::kFloat32) {
    BiasSwigluForwardKernel<float><<<grid, kThreads, 0, stream>>>(
        rows, ffn, bias, static_cast<float*>(pre), static_cast<float*>(out));
  } else {
    BiasSwigluForwardKernel<bf16><<<grid, kThreads, 0, stream>>>(
        rows, ffn, bias, static_cast<bf16*>(pre), static_cast<bf16*>(out));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("BiasSwigluForwardKernel");
  return absl::OkStatus();
}

absl::Status SwigluBackward(DType dtype, int64_t rows, int64_t ffn,
                            const void* pre, const void* d_out, void* d_pre,
                            Stream stream) {
  TY_RETURN_IF_ERROR(CheckActivationDType("SwigluBackward", dtype));
  TY_RETURN_IF_ERROR(CheckSizes("SwigluBackward", rows, ffn));
  if (rows * ffn == 0) return absl::OkStatus();
  TY_RETURN_IF_ERROR(CheckPtr("SwigluBackward", "pre", pre));
  TY_RETURN_IF_ERROR(CheckPtr("SwigluBackward", "d_out", d_out));
  TY_RETURN_IF_ERROR(CheckPtr("SwigluBackward", "d_pre", d_pre));
  const unsigned grid = GridFor(rows * ffn, kThreads);
  if (dtype == DType::kFloat32) {
    SwigluBackwardKernel<float><<<grid, kThreads, 0, stream>>>(
        rows, ffn, static_cast<const float*>(pre),
        static_cast<const float*>(d_out), static_cast<float*>(d_pre));
  } else {
    SwigluBackwardKernel<bf16><<<grid, kThreads, 0, stream>>>(
        rows, ffn, static_cast<const bf16*>(pre),
        static_cast<const bf16*>(d_out), static_cast<bf16*>(d_pre));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("SwigluBackwardKernel");
  return absl::OkStatus();
}

absl::Status AddBiasResidual(DType dtype, int64_t rows, int64_t cols,
                             const float* bias, const void* residual, void* y,
                             Stream stream) {
  TY_RETURN_IF_ERROR(CheckActivationDType("AddBiasResidual", dtype));
  TY_RETURN_IF_ERROR(CheckSizes("AddBiasResidual", rows, cols));
  if (rows * cols == 0 || (bias == nullptr && residual == nullptr)) {
    return absl::OkStatus();
  }
  TY_RETURN_IF_ERROR(CheckPtr("AddBiasResidual", "y", y));
  const unsigned grid = GridFor(rows * cols, kThreads);
  if (dtype == DType::kFloat32) {
    AddBiasResidualKernel<float><<<grid, kThreads, 0, stream>>>(
        rows, cols, bias, static_cast<const float*>(residual),
        static_cast<float*>(y));
  } else {
    AddBiasResidualKernel<bf16><<<grid, kThreads, 0, stream>>>(
        rows, cols, bias, static_cast<const bf16*>(residual),
        static_cast<bf16*>(y));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("AddBiasResidualKernel");
  return absl::OkStatus();
}

absl::Status ColumnSums(DType dtype, int64_t rows, int64_t cols, const void* x,
                        bool accumulate, float* out, Stream stream) {
  TY_RETURN_IF_ERROR(CheckActivationDType("ColumnSums", dtype));
  TY_RETURN_IF_ERROR(CheckSizes("ColumnSums", rows, cols));
  if (cols == 0) return absl::OkStatus();
  TY_RETURN_IF_ERROR(CheckPtr("ColumnSums", "out", out));
  if (rows > 0) TY_RETURN_IF_ERROR(CheckPtr("ColumnSums", "x", x));
  const unsigned grid = GridFor(cols, kColTile);
  constexpr int kBlock = kColTile * kRowLanes;
  if (dtype == DType::kFloat32) {
    ColumnSumsKernel<float><<<grid, kBlock, 0, stream>>>(
        rows, cols, static_cast<const float*>(x), accumulate, out);
  } else {
    ColumnSumsKernel<bf16><<<grid, kBlock, 0, stream>>>(
        rows, cols, static_cast<const bf16*>(x), accumulate, out);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("ColumnSumsKernel");
  return absl::OkStatus();
}

absl::Status CastFloatToBf16(int64_t n, const float* src, void* dst,
                             Stream stream) {
  return LaunchCast<float, bf16>("CastFloatToBf16", n, src, dst, stream);
}

absl::Status CastBf16ToFloat(int64_t n, const void* src, float* dst,
                             Stream stream) {
  return LaunchCast<bf16, float>("CastBf16ToFloat", n, src, dst, stream);
}

absl::Status CastFloat16ToFloat(int64_t n, const void* src, float* dst,
                                Stream stream) {
  return LaunchCast<__half, float>("CastFloat16ToFloat", n, src, dst, stream);
}

absl::Status CastFloat16ToBf16(int64_t n, const void* src, void* dst,
                               Stream stream) {
  return LaunchCast<__half, bf16>("CastFloat16ToBf16", n, src, dst, stream);
}

}  // namespace gpu
}  // namespace trainyard
