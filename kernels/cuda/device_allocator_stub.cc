// device_allocator.h without a CUDA toolkit: ForDevice fails cleanly, so no
// DeviceAllocator object ever exists.
#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/no_cuda.h"

namespace trainyard {
namespace gpu {

struct DeviceAllocator::State {};

absl::StatusOr<DeviceAllocator*> DeviceAllocator::ForDevice(int device) {
  return NoCuda(absl::StrCat("DeviceAllocator for cuda:", device));
}
absl::StatusOr<void*> DeviceAllocator::Allocate(size_t) {
  return NoCuda("DeviceAllocator::Allocate");
}
absl::Status DeviceAllocator::Free(void*) {
  return NoCuda("DeviceAllocator::Free");
}
absl::Status DeviceAllocator::EmptyCache() {
  return NoCuda("DeviceAllocator::EmptyCache");
}
AllocatorStats DeviceAllocator::stats() const { return AllocatorStats(); }

}  // namespace gpu
}  // namespace trainyard
