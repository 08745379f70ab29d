// CUDA_RETURN_IF_ERROR / CUBLAS_RETURN_IF_ERROR: turn a CUDA runtime or
// cuBLAS(Lt) result code into an absl::Status that names the call, the
// file:line and the library's error name and string, and return it from the
// enclosing function (shaped like NCCL's checks.h, but returning instead of
// exiting: a worker must live to report its error). Only for .cc/.cu files
// of this folder; includes the CUDA headers.
#ifndef TRAINYARD_KERNELS_CUDA_CUDA_STATUS_H_
#define TRAINYARD_KERNELS_CUDA_CUDA_STATUS_H_

#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainyard {
namespace gpu {
namespace internal {

inline absl::Status CudaErrorToStatus(cudaError_t e, const char* expr,
                                      const char* file, int line) {
  std::string msg =
      absl::StrCat(expr, " failed at ", file, ":", line, ": ",
                   cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  switch (e) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::FailedPreconditionError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

inline absl::Status CublasErrorToStatus(cublasStatus_t s, const char* expr,
                                        const char* file, int line) {
  std::string msg =
      absl::StrCat(expr, " failed at ", file, ":", line, ": ",
                   cublasGetStatusName(s), " (", cublasGetStatusString(s), ")");
  switch (s) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(msg);
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::UnimplementedError(msg);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(msg);
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace internal
}  // namespace gpu
}  // namespace trainyard

#define CUDA_RETURN_IF_ERROR(expr)                          \
  do {                                                      \
    const cudaError_t _ty_cuda_err = (expr);                \
    if (_ty_cuda_err != cudaSuccess) {                      \
      return ::trainyard::gpu::internal::CudaErrorToStatus( \
          _ty_cuda_err, #expr, __FILE__, __LINE__);         \
    }                                                       \
  } while (0)

#define CUBLAS_RETURN_IF_ERROR(expr)                          \
  do {                                                        \
    const cublasStatus_t _ty_cublas_st = (expr);              \
    if (_ty_cublas_st != CUBLAS_STATUS_SUCCESS) {             \
      return ::trainyard::gpu::internal::CublasErrorToStatus( \
          _ty_cublas_st, #expr, __FILE__, __LINE__);          \
    }                                                         \
  } while (0)

// After a kernel launch: reports launch errors (bad configuration, no
// kernel image for this device) naming the kernel (a string literal).
#define CUDA_RETURN_IF_LAUNCH_ERROR(kernel_name)                       \
  do {                                                                 \
    const cudaError_t _ty_cuda_err = cudaGetLastError();               \
    if (_ty_cuda_err != cudaSuccess) {                                 \
      return ::trainyard::gpu::internal::CudaErrorToStatus(            \
          _ty_cuda_err, "launch of " kernel_name, __FILE__, __LINE__); \
    }                                                                  \
  } while (0)

#endif  // TRAINYARD_KERNELS_CUDA_CUDA_STATUS_H_
