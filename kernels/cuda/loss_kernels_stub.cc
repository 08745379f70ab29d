// loss_kernels.h without a CUDA toolkit: every launcher fails cleanly.
#include "kernels/cuda/loss_kernels.h"
#include "kernels/cuda/no_cuda.h"

namespace trainyard {
namespace gpu {
size_t MseWorkspaceBytes(int64_t, int64_t) { return 0; }
size_t ClassifierWorkspaceBytes(int64_t, int64_t) { return 0; }

absl::Status MseLoss(const losses::Output&, const float*, void*, double*,
                     Stream) {
  return NoCuda("MseLoss");
}

absl::Status CrossEntropyLoss(const losses::Output&, const losses::Labels&,
                              double, void*, double*, Stream) {
  return NoCuda("CrossEntropyLoss");
}

absl::Status DistillationLoss(const losses::Output&, const float*,
                              const losses::Labels&, double, double, void*,
                              double*, Stream) {
  return NoCuda("DistillationLoss");
}

}  // namespace gpu
}  // namespace trainyard
