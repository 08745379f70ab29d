// Device helpers shared by this folder's .cu files: float32 <-> bfloat16
// loads and stores, warp reductions, launch geometry. Only for .cu files.
#ifndef TRAINYARD_KERNELS_CUDA_CUDA_MATH_CUH_
#define TRAINYARD_KERNELS_CUDA_CUDA_MATH_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/runtime.h"

namespace trainyard {
namespace gpu {
namespace internal {

__device__ __forceinline__ float Load(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void Store(float* p, int64_t i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void Store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// A grid-stride loop over n elements:
//   for (int64_t i = GridStrideBegin(); i < n; i += GridStrideStep())
// launched with GridFor(n, threads) blocks of `threads`.
__device__ __forceinline__ int64_t GridStrideBegin() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t GridStrideStep() {
  return int64_t{gridDim.x} * blockDim.x;
}

// Blocks for a grid-stride loop over n elements.
inline unsigned GridFor(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535 * 16) blocks = 65535 * 16;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

inline absl::Status CheckSizes(const char* kernel, int64_t a, int64_t b) {
  if (a < 0 || b < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": negative size (", a, ", ", b, ")"));
  }
  return absl::OkStatus();
}

inline absl::Status CheckPtr(const char* kernel, const char* name,
                             const void* p) {
  if (p == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": ", name, " is null"));
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace gpu
}  // namespace trainyard

#define TY_RETURN_IF_ERROR(expr)   \
  do {                             \
    ::absl::Status _ty_s = (expr); \
    if (!_ty_s.ok()) return _ty_s; \
  } while (0)

#endif  // TRAINYARD_KERNELS_CUDA_CUDA_MATH_CUH_
