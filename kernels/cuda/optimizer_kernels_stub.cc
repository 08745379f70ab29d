// optimizer_kernels.h without a CUDA toolkit: every launcher fails cleanly.
#include "kernels/cuda/no_cuda.h"
#include "kernels/cuda/optimizer_kernels.h"

namespace trainyard {
namespace gpu {
absl::Status FusedAdamW(const std::vector<ParamSegment>& segments,
                        const AdamWStep& hp, float* params, const float* grads,
                        float* exp_avg, float* exp_avg_sq, void* params_bf16,
                        Stream stream, const double* device_totals) {
  return NoCuda("FusedAdamW");
}

absl::Status FusedSgd(const std::vector<ParamSegment>& segments,
                      const SgdStep& hp, float* params, const float* grads,
                      float* momentum_buffer, void* params_bf16, Stream stream,
                      const double* device_totals) {
  return NoCuda("FusedSgd");
}

size_t GradSumsOfSquaresWorkspaceBytes(const std::vector<ParamSegment>&) {
  return 0;
}

absl::Status GradSumsOfSquares(const std::vector<ParamSegment>& segments,
                               const float* grads, void* workspace, double* out,
                               Stream stream) {
  return NoCuda("GradSumsOfSquares");
}

}  // namespace gpu
}  // namespace trainyard
