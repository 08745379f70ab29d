// loss_kernels.h without a CUDA toolkit: every launcher fails cleanly.
#include "kernels/cuda/loss_kernels.h"

namespace trainyard {
namespace gpu {
namespace {
absl::Status NoCuda(const char* what) {
  return absl::UnimplementedError(std::string(what) +
                                  ": Trainyard was built without CUDA");
}
}  // namespace

size_t LossWorkspaceBytes(int64_t rows) { return 0; }

absl::Status MseLoss(int64_t rows, int64_t cols, const float* out,
                     const float* target, float* grad, void* workspace,
                     LossResult* result, Stream stream) {
  return NoCuda("MseLoss");
}

absl::Status SoftmaxCrossEntropyLoss(int64_t rows, int64_t classes,
                                     const float* logits, const int64_t* labels,
                                     int64_t ignore_index,
                                     double label_smoothing, float* grad,
                                     void* workspace, LossResult* result,
                                     Stream stream) {
  return NoCuda("SoftmaxCrossEntropyLoss");
}

}  // namespace gpu
}  // namespace trainyard
