// The engine's small per-step kernels on a GPU (kernels/device_ops.h
// dispatches to them): gathering a batch's rows from the resident dataset,
// finding the first non-finite element of a tensor, and a one-stage step's
// totals (core/step_totals.h). Launchers enqueue on `stream`, never wait,
// and check their arguments and the launch. Deterministic: no float
// atomics (the non-finite search takes the minimum index with an integer
// atomic, which is exact). Thread-safe.
#ifndef TRAINYARD_KERNELS_CUDA_STEP_KERNELS_H_
#define TRAINYARD_KERNELS_CUDA_STEP_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/step_totals.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"

namespace trainyard {
namespace gpu {

// dst[i, :] = src[rows[i], :] for i in [0, n), cols elements a row.
// Same dtype (any element size), or float32 src into bfloat16 dst (rounded
// to nearest even). Every rows[i] must be a row of src (the caller's).
absl::Status GatherRows(DType src_dtype, DType dst_dtype, int64_t n,
                        int64_t cols, const void* src, const int64_t* rows,
                        void* dst, Stream stream);

// The first element of data[0, n) (float32 or bfloat16) that is not
// finite, into slot (2 words, zeroed by the caller): word 0 =
// UINT64_MAX - index (0: none), word 1 = the value as a double.
absl::Status FindNonFinite(DType dtype, int64_t n, const void* data, void* slot,
                           Stream stream);

// ComputeDeviceTotals on one thread.
absl::Status DeviceTotals(const DeviceTotalsArgs& args, Stream stream);

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_STEP_KERNELS_H_
