// What every CUDA entry point of a build without the toolkit returns (the
// *_stub.cc sources).
#ifndef TRAINYARD_KERNELS_CUDA_NO_CUDA_H_
#define TRAINYARD_KERNELS_CUDA_NO_CUDA_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainyard {
namespace gpu {

// Unimplemented "<what>: Trainyard was built without CUDA".
inline absl::Status NoCuda(absl::string_view what) {
  return absl::UnimplementedError(
      absl::StrCat(what, ": Trainyard was built without CUDA"));
}

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_NO_CUDA_H_
