// device_allocator.h without a CUDA toolkit: ForDevice fails cleanly, so no
// DeviceAllocator object ever exists.
#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_allocator.h"

namespace trainyard {
namespace gpu {

struct DeviceAllocator::State {};

absl::StatusOr<DeviceAllocator*> DeviceAllocator::ForDevice(int device) {
  return absl::UnimplementedError(
      absl::StrCat("DeviceAllocator for cuda:", device,
                   ": Trainyard was built without CUDA"));
}
absl::StatusOr<void*> DeviceAllocator::Allocate(size_t) {
  return absl::UnimplementedError("built without CUDA");
}
absl::Status DeviceAllocator::Free(void*) {
  return absl::UnimplementedError("built without CUDA");
}
absl::Status DeviceAllocator::EmptyCache() {
  return absl::UnimplementedError("built without CUDA");
}
AllocatorStats DeviceAllocator::stats() const { return AllocatorStats(); }

}  // namespace gpu
}  // namespace trainyard
