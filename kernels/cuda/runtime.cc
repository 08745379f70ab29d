#include "kernels/cuda/runtime.h"

#include "kernels/cuda/cuda_status.h"

namespace trainyard {
namespace gpu {

absl::StatusOr<int> DeviceCount() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the error for later calls
    return absl::FailedPreconditionError(
        absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(e), " (",
                     cudaGetErrorString(e), ")"));
  }
  return n;
}

absl::Status CheckDevice(int device) {
  absl::StatusOr<int> n = DeviceCount();
  if (!n.ok()) return n.status();
  if (device < 0 || device >= *n) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA device ", device, " does not exist (", *n, " visible)"));
  }
  return absl::OkStatus();
}

absl::Status SetDevice(int device) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return absl::OkStatus();
}

absl::Status StreamSynchronize(Stream stream) {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status CopyHostToDevice(void* dst, const void* src, size_t bytes,
                              Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status CopyDeviceToHost(void* dst, const void* src, size_t bytes,
                              Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes,
                                Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  return absl::OkStatus();
}

absl::Status MemsetAsync(void* dst, int value, size_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, value, bytes, stream));
  return absl::OkStatus();
}

absl::Status CopyHostToDeviceAsync(void* dst, const void* src, size_t bytes,
                                   Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

absl::Status CopyDeviceToHostAsync(void* dst, const void* src, size_t bytes,
                                   Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  return absl::OkStatus();
}

absl::StatusOr<void*> AllocPinned(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(
        "cudaHostAlloc of ", bytes, " bytes: ", cudaGetErrorName(e), " (",
        cudaGetErrorString(e), ")"));
  }
  return p;
}

void FreePinned(void* ptr) {
  if (ptr != nullptr) cudaFreeHost(ptr);
}

absl::StatusOr<Stream> CreateStream(int device) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

absl::StatusOr<Event> CreateEvent() {
  cudaEvent_t e = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
  return e;
}

void DestroyEvent(Event event) {
  if (event != nullptr) cudaEventDestroy(event);
}

absl::Status RecordEvent(Event event, Stream stream) {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(event, stream));
  return absl::OkStatus();
}

absl::StatusOr<float> ElapsedMs(Event start, Event end) {
  float ms = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, end));
  return ms;
}

absl::StatusOr<MemoryInfo> GetMemoryInfo(int device) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  MemoryInfo info;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
}

}  // namespace gpu
}  // namespace trainyard
