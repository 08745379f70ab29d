// Small host-side helpers over the CUDA runtime: device discovery, stream
// synchronisation and synchronous copies, with every failure an absl::Status
// (the CUDA error name and string included). Headers in this folder never
// include CUDA headers, so code that uses them builds without a toolkit;
// then every function returns UnimplementedError("... built without CUDA").
//
// Thread safety: all functions may be called from any thread.
#ifndef TRAINYARD_KERNELS_CUDA_DEVICE_H_
#define TRAINYARD_KERNELS_CUDA_DEVICE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

// The CUDA runtime's stream handle type is `CUstream_st*` (cudaStream_t);
// declaring the struct here keeps CUDA headers out of our headers.
struct CUstream_st;

namespace trainyard {
namespace gpu {

using Stream = CUstream_st*;  // == cudaStream_t; nullptr is the legacy stream

// Device activations are DType::kFloat32 or DType::kBFloat16 (the engine's
// DType, core/tensor.h). Parameters, their gradients and optimizer state
// are always float32 (master weights). OK for those two; otherwise
// InvalidArgument "<what>: dtype <name> is not supported (float32 or
// bfloat16)". Every launcher that takes a DType checks it with this.
inline absl::Status CheckActivationDType(absl::string_view what, DType dtype) {
  if (dtype == DType::kFloat32 || dtype == DType::kBFloat16) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": dtype ", DTypeName(dtype),
                   " is not supported (float32 or bfloat16)"));
}

// Number of visible CUDA devices. Errors: FailedPrecondition with the CUDA
// error (e.g. cudaErrorNoDevice, cudaErrorInsufficientDriver when there is
// no driver), Unimplemented when built without CUDA.
absl::StatusOr<int> DeviceCount();

// OK when `device` exists; otherwise the reason (no driver, no device,
// index out of range, built without CUDA).
absl::Status CheckDevice(int device);

// Makes `device` current for the calling thread.
absl::Status SetDevice(int device);

absl::Status StreamSynchronize(Stream stream);

// Copies `bytes` on `stream` and waits for the copy (synchronous helpers
// for tests and setup; the step loop uses device-to-device kernels only).
absl::Status CopyHostToDevice(void* dst, const void* src, size_t bytes,
                              Stream stream);
absl::Status CopyDeviceToHost(void* dst, const void* src, size_t bytes,
                              Stream stream);
absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes,
                                Stream stream);  // asynchronous
// Sets `bytes` bytes to `value` on `stream` (asynchronous).
absl::Status MemsetAsync(void* dst, int value, size_t bytes, Stream stream);

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_DEVICE_H_
