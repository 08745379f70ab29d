// Kernels first, then the launchers of step_kernels.h.
#include <cstring>

#include "kernels/cuda/cuda_math.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/step_kernels.h"

namespace trainyard {
namespace gpu {
namespace {

using internal::GridStrideBegin;
using internal::GridStrideStep;
using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

template <typename T>
__global__ void GatherKernel(int64_t n, int64_t cols, const T* __restrict__ src,
                             const int64_t* __restrict__ rows,
                             T* __restrict__ dst) {
  const int64_t total = n * cols;
  for (int64_t i = GridStrideBegin(); i < total; i += GridStrideStep()) {
    const int64_t r = i / cols;
    dst[i] = src[rows[r] * cols + (i - r * cols)];
  }
}

__global__ void GatherToBf16Kernel(int64_t n, int64_t cols,
                                   const float* __restrict__ src,
                                   const int64_t* __restrict__ rows,
                                   bf16* __restrict__ dst) {
  const int64_t total = n * cols;
  for (int64_t i = GridStrideBegin(); i < total; i += GridStrideStep()) {
    const int64_t r = i / cols;
    dst[i] = __float2bfloat16_rn(src[rows[r] * cols + (i - r * cols)]);
  }
}

template <typename T>
__global__ void NonFiniteKernel(int64_t n, const T* __restrict__ data,
                                unsigned long long* slot) {
  for (int64_t i = GridStrideBegin(); i < n; i += GridStrideStep()) {
    if (!isfinite(internal::Load(data, i))) {
      // The largest of UINT64_MAX - i is the smallest index: exact.
      atomicMax(slot, ~0ull - static_cast<unsigned long long>(i));
    }
  }
}

template <typename T>
__global__ void NonFiniteValueKernel(const T* __restrict__ data,
                                     unsigned long long* slot) {
  if (slot[0] == 0) return;
  const int64_t i = static_cast<int64_t>(~0ull - slot[0]);
  const double v = static_cast<double>(internal::Load(data, i));
  memcpy(slot + 1, &v, sizeof(v));
}

__global__ void DeviceTotalsKernel(DeviceTotalsArgs args) {
  ComputeDeviceTotals(args);
}

}  // namespace

absl::Status GatherRows(DType src_dtype, DType dst_dtype, int64_t n,
                        int64_t cols, const void* src, const int64_t* rows,
                        void* dst, Stream stream) {
  const char* k = "GatherRows";
  TY_RETURN_IF_ERROR(internal::CheckSizes(k, n, cols));
  if (n * cols == 0) return absl::OkStatus();
  TY_RETURN_IF_ERROR(internal::CheckPtr(k, "src", src));
  TY_RETURN_IF_ERROR(internal::CheckPtr(k, "rows", rows));
  TY_RETURN_IF_ERROR(internal::CheckPtr(k, "dst", dst));
  const unsigned grid = internal::GridFor(n * cols, kThreads);
  if (src_dtype == dst_dtype) {
    switch (DTypeSize(src_dtype)) {
      case 1:
        GatherKernel<uint8_t><<<grid, kThreads, 0, stream>>>(
            n, cols, static_cast<const uint8_t*>(src), rows,
            static_cast<uint8_t*>(dst));
        break;
      case 2:
        GatherKernel<uint16_t><<<grid, kThreads, 0, stream>>>(
            n, cols, static_cast<const uint16_t*>(src), rows,
            static_cast<uint16_t*>(dst));
        break;
      case 4:
        GatherKernel<uint32_t><<<grid, kThreads, 0, stream>>>(
            n, cols, static_cast<const uint32_t*>(src), rows,
            static_cast<uint32_t*>(dst));
        break;
      default:
        GatherKernel<uint64_t><<<grid, kThreads, 0, stream>>>(
            n, cols, static_cast<const uint64_t*>(src), rows,
            static_cast<uint64_t*>(dst));
        break;
    }
  } else if (src_dtype == DType::kFloat32 && dst_dtype == DType::kBFloat16) {
    GatherToBf16Kernel<<<grid, kThreads, 0, stream>>>(
        n, cols, static_cast<const float*>(src), rows, static_cast<bf16*>(dst));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        k, ": from ", DTypeName(src_dtype), " to ", DTypeName(dst_dtype),
        " (the same dtype, or float32 to "
        "bfloat16)"));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("GatherKernel");
  return absl::OkStatus();
}

absl::Status FindNonFinite(DType dtype, int64_t n, const void* data, void* slot,
                           Stream stream) {
  const char* k = "FindNonFinite";
  TY_RETURN_IF_ERROR(internal::CheckSizes(k, n, 0));
  TY_RETURN_IF_ERROR(CheckActivationDType(k, dtype));
  TY_RETURN_IF_ERROR(internal::CheckPtr(k, "slot", slot));
  if (n == 0) return absl::OkStatus();
  TY_RETURN_IF_ERROR(internal::CheckPtr(k, "data", data));
  auto* s = static_cast<unsigned long long*>(slot);
  const unsigned grid = internal::GridFor(n, kThreads);
  if (dtype == DType::kFloat32) {
    NonFiniteKernel<float>
        <<<grid, kThreads, 0, stream>>>(n, static_cast<const float*>(data), s);
    CUDA_RETURN_IF_LAUNCH_ERROR("NonFiniteKernel");
    NonFiniteValueKernel<float>
        <<<1, 1, 0, stream>>>(static_cast<const float*>(data), s);
  } else {
    NonFiniteKernel<bf16>
        <<<grid, kThreads, 0, stream>>>(n, static_cast<const bf16*>(data), s);
    CUDA_RETURN_IF_LAUNCH_ERROR("NonFiniteKernel");
    NonFiniteValueKernel<bf16>
        <<<1, 1, 0, stream>>>(static_cast<const bf16*>(data), s);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR("NonFiniteValueKernel");
  return absl::OkStatus();
}

absl::Status DeviceTotals(const DeviceTotalsArgs& args, Stream stream) {
  const char* k = "DeviceTotals";
  TY_RETURN_IF_ERROR(internal::CheckPtr(k, "totals", args.totals));
  if (args.num_params > 0) {
    TY_RETURN_IF_ERROR(
        internal::CheckPtr(k, "sums_of_squares", args.sums_of_squares));
  }
  if (args.num_microbatches > 0) {
    TY_RETURN_IF_ERROR(
        internal::CheckPtr(k, "microbatches", args.microbatches));
  }
  DeviceTotalsKernel<<<1, 1, 0, stream>>>(args);
  CUDA_RETURN_IF_LAUNCH_ERROR("DeviceTotalsKernel");
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace trainyard
