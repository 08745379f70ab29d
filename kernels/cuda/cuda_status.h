// CUDA runtime and cuBLAS(Lt) result codes as absl::Status: one macro per
// library, shaped like NCCL's src/include/checks.h but returning the Status
// from the enclosing function instead of exiting (a worker must live to
// report its error to the controller). The message names the call, its
// file:line, the library's error name and string, and an optional context
// (the thing being worked on, e.g. "nccl transport (job \"j\", rank 1)"):
//
//   CUDA_RETURN_IF_ERROR(cudaSetDevice(d));
//   CUDA_RETURN_IF_ERROR(cudaMallocAsync(&p, n, s), where_);
//   // -> "<where_>: cudaMallocAsync(&p, n, s) failed at core/x.cc:12:
//   //     cudaErrorMemoryAllocation (out of memory)"
//
// Codes: out of memory -> ResourceExhausted; no device / driver ->
// FailedPrecondition; invalid value or launch configuration ->
// InvalidArgument; cuBLAS "not supported" / architecture mismatch ->
// Unimplemented; anything else -> Internal.
//
// Includes the CUDA headers: only for sources that are compiled with the
// toolkit (the //kernels/cuda:cuda_status target depends on @cuda only when the
// toolkit exists; stub builds must not include this header). Public
// headers of the GPU layer never include it.
#ifndef TRAINYARD_KERNELS_CUDA_CUDA_STATUS_H_
#define TRAINYARD_KERNELS_CUDA_CUDA_STATUS_H_

#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// "<context>: <call> failed at <file>:<line>: <name> (<string>)", the
// context and its ": " left out when empty.
inline absl::Status CudaErrorToStatus(cudaError_t e, absl::string_view call,
                                      const char* file, int line,
                                      absl::string_view context = {}) {
  std::string msg = absl::StrCat(
      context, context.empty() ? "" : ": ", call, " failed at ", file, ":",
      line, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
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

inline absl::Status CublasErrorToStatus(cublasStatus_t s,
                                        absl::string_view call,
                                        const char* file, int line,
                                        absl::string_view context = {}) {
  std::string msg = absl::StrCat(
      context, context.empty() ? "" : ": ", call, " failed at ", file, ":",
      line, ": ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ")");
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

}  // namespace trainyard

// CUDA_RETURN_IF_ERROR(expr) or CUDA_RETURN_IF_ERROR(expr, context): returns
// the Status of a failed cudaError_t `expr`; `context` is anything that
// converts to absl::string_view.
#define CUDA_RETURN_IF_ERROR(expr, ...)                                    \
  do {                                                                     \
    const cudaError_t _ty_cuda_err = (expr);                               \
    if (_ty_cuda_err != cudaSuccess) {                                     \
      return ::trainyard::CudaErrorToStatus(_ty_cuda_err, #expr, __FILE__, \
                                            __LINE__, ##__VA_ARGS__);      \
    }                                                                      \
  } while (0)

// The same for a cublasStatus_t (cuBLAS and cuBLASLt).
#define CUBLAS_RETURN_IF_ERROR(expr, ...)                                     \
  do {                                                                        \
    const cublasStatus_t _ty_cublas_st = (expr);                              \
    if (_ty_cublas_st != CUBLAS_STATUS_SUCCESS) {                             \
      return ::trainyard::CublasErrorToStatus(_ty_cublas_st, #expr, __FILE__, \
                                              __LINE__, ##__VA_ARGS__);       \
    }                                                                         \
  } while (0)

// After a kernel launch: returns launch errors (bad configuration, no
// kernel image for this device) naming the kernel (a string literal).
#define CUDA_RETURN_IF_LAUNCH_ERROR(kernel_name)                       \
  do {                                                                 \
    const cudaError_t _ty_cuda_err = cudaGetLastError();               \
    if (_ty_cuda_err != cudaSuccess) {                                 \
      return ::trainyard::CudaErrorToStatus(                           \
          _ty_cuda_err, "launch of " kernel_name, __FILE__, __LINE__); \
    }                                                                  \
  } while (0)

#endif  // TRAINYARD_KERNELS_CUDA_CUDA_STATUS_H_
