#include "core/allocator.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace trainyard {
namespace {

class AlignedHostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cpu(); }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    // aligned_alloc needs a size that is a multiple of the alignment.
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = rounded < bytes ? nullptr : std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of host memory allocating ", bytes, " bytes"));
    }
    return p;
  }

  void Deallocate(void* ptr) override { std::free(ptr); }
};

}  // namespace

Allocator* HostAllocator() {
  static Allocator* const kHost = new AlignedHostAllocator();
  return kHost;
}

}  // namespace trainyard
