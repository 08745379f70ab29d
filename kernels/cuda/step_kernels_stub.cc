// step_kernels.h without a CUDA toolkit: every launcher fails cleanly.
#include "kernels/cuda/no_cuda.h"
#include "kernels/cuda/step_kernels.h"

namespace trainyard {
namespace gpu {
absl::Status GatherRows(DType, DType, int64_t, int64_t, const void*,
                        const int64_t*, void*, Stream) {
  return NoCuda("GatherRows");
}
absl::Status FindNonFinite(DType, int64_t, const void*, void*, Stream) {
  return NoCuda("FindNonFinite");
}
absl::Status DeviceTotals(const DeviceTotalsArgs&, Stream) {
  return NoCuda("DeviceTotals");
}

}  // namespace gpu
}  // namespace trainyard
