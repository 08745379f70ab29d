// Small host-side helpers over the CUDA runtime: device discovery, stream
// synchronisation and synchronous copies, with every failure an absl::Status
// (the CUDA error name and string included). Headers in this folder never
// include CUDA headers, so code that uses them builds without a toolkit;
// then every function returns UnimplementedError("... built without CUDA").
//
// Thread safety: all functions may be called from any thread.
#ifndef TRAINYARD_KERNELS_CUDA_RUNTIME_H_
#define TRAINYARD_KERNELS_CUDA_RUNTIME_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

// The CUDA runtime's stream and event handle types are `CUstream_st*`
// (cudaStream_t) and `CUevent_st*` (cudaEvent_t); declaring the structs
// here keeps CUDA headers out of our headers.
struct CUstream_st;
struct CUevent_st;

namespace trainyard {
namespace gpu {

using Stream = CUstream_st*;  // == cudaStream_t; nullptr is the legacy stream
using Event = CUevent_st*;    // == cudaEvent_t

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

// Asynchronous copies between pinned host memory (AllocPinned) and the
// device, queued on `stream`: the host must leave `src` unchanged (and not
// read `dst`) until the stream has passed the copy.
absl::Status CopyHostToDeviceAsync(void* dst, const void* src, size_t bytes,
                                   Stream stream);
absl::Status CopyDeviceToHostAsync(void* dst, const void* src, size_t bytes,
                                   Stream stream);

// Page-locked host memory (cudaHostAlloc), which the copy engines read and
// write without staging. Errors: ResourceExhausted naming the size.
absl::StatusOr<void*> AllocPinned(size_t bytes);
void FreePinned(void* ptr);

// A non-blocking stream on `device` (it does not wait for the legacy
// default stream). Never destroyed: one per GPU for the life of the
// process.
absl::StatusOr<Stream> CreateStream(int device);

// Timing events: created with timing on; record on a stream; the time
// between two of them once both have completed.
absl::StatusOr<Event> CreateEvent();
void DestroyEvent(Event event);
absl::Status RecordEvent(Event event, Stream stream);
// Milliseconds from `start` to `end` (both recorded and completed).
absl::StatusOr<float> ElapsedMs(Event start, Event end);

// Free and total bytes of the current device's memory.
struct MemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
absl::StatusOr<MemoryInfo> GetMemoryInfo(int device);

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_RUNTIME_H_
