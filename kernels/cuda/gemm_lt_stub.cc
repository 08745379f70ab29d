// gemm_lt.h without a CUDA toolkit: Create fails cleanly.
#include "absl/strings/str_cat.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/no_cuda.h"

namespace trainyard {
namespace gpu {

struct GemmLt::Impl {};

const char* GemmPrecisionName(GemmPrecision) { return "?"; }
const char* GemmEpilogueName(GemmEpilogue) { return "?"; }
GemmLt::GemmLt(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GemmLt::~GemmLt() = default;
int64_t GemmLt::cached_plans() const { return 0; }
absl::StatusOr<std::unique_ptr<GemmLt>> GemmLt::Create(int device) {
  return NoCuda(absl::StrCat("GemmLt on cuda:", device));
}
absl::Status GemmLt::Run(const GemmArgs&, Stream) {
  return NoCuda("GemmLt::Run");
}

}  // namespace gpu
}  // namespace trainyard
