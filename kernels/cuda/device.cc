#include "kernels/cuda/device.h"

#include "core/cuda_status.h"

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

}  // namespace gpu
}  // namespace trainyard
