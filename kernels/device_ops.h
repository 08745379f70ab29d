// Small operations a step queues on its stage's device besides the blocks'
// and the optimizer's: gathering a batch's rows from a dataset held on the
// device, checking a tensor for non-finite values, and a one-stage step's
// totals. On the CPU and the simulated device they run on the host as they
// are queued; on a GPU they are kernels on the context's stream
// (kernels/cuda/step_kernels.h). None of them waits for the device.
//
// Thread safety: as the ExecContext's.
#ifndef TRAINYARD_KERNELS_DEVICE_OPS_H_
#define TRAINYARD_KERNELS_DEVICE_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/step_totals.h"
#include "core/tensor.h"
#include "kernels/exec_context.h"

namespace trainyard {

// dst[i, :] = src[rows[i], :] for every row i of dst, converted to dst's
// dtype (src's, or bfloat16 from float32). src [N, ...] and dst [n, ...]
// with equal row sizes and rows int64 [n], all on ctx's device; every
// rows[i] in [0, N) (the caller's duty; another is a bug). Errors:
// mismatched shapes, dtypes or devices.
absl::Status GatherRows(const ExecContext& ctx, const Tensor& src,
                        const Tensor& rows, Tensor* dst);

// Records the first element of `t` (float32 or bfloat16, on ctx's device)
// that is not finite in `slot`: two 8-byte words of device memory on ctx's
// device, zeroed by the caller (core/step_totals.h's NonFiniteFound).
// Decode it on the host, after a synchronisation, with DecodeNonFinite.
absl::Status FindNonFinite(const ExecContext& ctx, const Tensor& t,
                           double* slot);
struct NonFinite {
  bool found = false;
  int64_t index = 0;  // flat index of the first non-finite element
  double value = 0;
};
NonFinite DecodeNonFinite(const double* host_slot);

// ComputeDeviceTotals (core/step_totals.h) queued on ctx's device; every
// pointer in `args` is device memory of ctx's device.
absl::Status DeviceTotals(const ExecContext& ctx, const DeviceTotalsArgs& args);

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_DEVICE_OPS_H_
