// loss_kernels.h without a CUDA toolkit: every launcher fails cleanly.
#include "kernels/cuda/loss_kernels.h"
#include "kernels/cuda/no_cuda.h"

namespace trainyard {
namespace gpu {
size_t MseWorkspaceBytes(int64_t, int64_t) { return 0; }
size_t ClassifierWorkspaceBytes(int64_t, int64_t) { return 0; }

absl::Status MseLoss(const LossOutput&, const float*, void*, double*, Stream) {
  return NoCuda("MseLoss");
}

absl::Status CrossEntropyLoss(const LossOutput&, DType, const void*, int64_t,
                              double, void*, double*, Stream) {
  return NoCuda("CrossEntropyLoss");
}

absl::Status DistillationLoss(const LossOutput&, const float*, DType,
                              const void*, int64_t, double, double, void*,
                              double*, Stream) {
  return NoCuda("DistillationLoss");
}

}  // namespace gpu
}  // namespace trainyard
