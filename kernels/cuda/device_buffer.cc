// DeviceBuffer (device_allocator.h): the same code with and without CUDA;
// without it, Allocate fails in DeviceAllocator::ForDevice.
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_allocator.h"

namespace trainyard {
namespace gpu {

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int device, size_t bytes) {
  absl::StatusOr<DeviceAllocator*> a = DeviceAllocator::ForDevice(device);
  if (!a.ok()) return a.status();
  absl::StatusOr<void*> p = (*a)->Allocate(bytes);
  if (!p.ok()) return p.status();
  DeviceBuffer b;
  b.allocator_ = *a;
  b.ptr_ = *p;
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    allocator_ = std::exchange(other.allocator_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr) {
    // Cannot fail: ptr_ came from this allocator and is live.
    allocator_->Free(ptr_).IgnoreError();
  }
  allocator_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::Status DeviceBuffer::CopyFromHost(const void* src, size_t bytes,
                                        Stream stream) {
  if (bytes > bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceBuffer::CopyFromHost: ", bytes,
                     " bytes into a buffer of ", bytes_));
  }
  return CopyHostToDevice(ptr_, src, bytes, stream);
}

absl::Status DeviceBuffer::CopyToHost(void* dst, size_t bytes,
                                      Stream stream) const {
  if (bytes > bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceBuffer::CopyToHost: ", bytes,
                     " bytes from a buffer of ", bytes_));
  }
  return CopyDeviceToHost(dst, ptr_, bytes, stream);
}

absl::Status DeviceBuffer::Fill(uint8_t value, Stream stream) {
  absl::Status s = MemsetAsync(ptr_, value, bytes_, stream);
  if (!s.ok()) return s;
  return StreamSynchronize(stream);
}

}  // namespace gpu
}  // namespace trainyard
