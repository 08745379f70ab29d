// DeviceAllocator: a caching allocator of device memory, one per device
// (after PyTorch's CUDA caching allocator, much simplified).
//
// Requests are rounded up to a size class (multiples of 512 bytes below
// 1 MiB, then four classes per power of two); a freed block goes to its
// class's free list and is handed out again for the next request of the
// same class, so a step loop that allocates the same sizes every step calls
// cudaMalloc only during its first step. EmptyCache() returns the cached
// blocks to the driver; an allocation that fails with out-of-memory empties
// the cache and retries once.
//
// Streams: a freed block may be handed out at once. That is safe when all
// work touching the memory is ordered on one stream (the usual case), or
// when the caller synchronised; work on other streams must be synchronised
// by the caller before Free.
//
// DeviceBuffer owns one block (RAII, move-only).
//
// Thread safety: DeviceAllocator is thread-safe. A DeviceBuffer is not.
#ifndef TRAINYARD_KERNELS_CUDA_DEVICE_ALLOCATOR_H_
#define TRAINYARD_KERNELS_CUDA_DEVICE_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/runtime.h"

namespace trainyard {
namespace gpu {

struct AllocatorStats {
  int64_t bytes_in_use = 0;  // rounded sizes of live blocks
  int64_t peak_bytes_in_use = 0;
  int64_t bytes_cached = 0;    // free blocks kept for reuse
  int64_t device_mallocs = 0;  // cudaMalloc calls so far
  int64_t allocations = 0;     // Allocate calls that returned memory
  int64_t cache_hits = 0;      // ... served from a free list
};

class DeviceAllocator {
 public:
  // The process-wide allocator of `device` (created on first use, never
  // destroyed). Errors: the device does not exist, or built without CUDA.
  static absl::StatusOr<DeviceAllocator*> ForDevice(int device);

  // The size class of a request: the bytes a block of that class holds.
  static size_t RoundSize(size_t bytes) {
    constexpr size_t kSmall = size_t{1} << 20;
    if (bytes <= kSmall) return bytes == 0 ? 512 : (bytes + 511) / 512 * 512;
    size_t pow2 = kSmall;
    while (pow2 * 2 < bytes) pow2 *= 2;  // pow2 < bytes <= 2 * pow2
    const size_t step = pow2 / 4;
    return (bytes + step - 1) / step * step;
  }

  // At least `bytes` bytes of device memory, 256-byte aligned.
  // Errors: ResourceExhausted (with cudaMalloc's message) when the device
  // is full even after emptying the cache.
  absl::StatusOr<void*> Allocate(size_t bytes);

  // Returns a block from Allocate to the cache; nullptr is a no-op.
  // Errors: InvalidArgument for a pointer this allocator did not hand out.
  absl::Status Free(void* ptr);

  // cudaFree's every cached (free) block; live blocks stay.
  absl::Status EmptyCache();

  AllocatorStats stats() const;
  int device() const { return device_; }

  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

 private:
  explicit DeviceAllocator(int device) : device_(device) {}
  struct State;
  const int device_;
  State* state_ = nullptr;  // owned; never freed (process lifetime)
};

// One block of device memory from a DeviceAllocator, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `bytes` bytes on `device` (bytes may be 0: a valid, empty buffer).
  static absl::StatusOr<DeviceBuffer> Allocate(int device, size_t bytes);

  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return bytes_; }  // bytes requested
  bool empty() const { return ptr_ == nullptr; }

  // Frees the block now (no-op when empty).
  void Reset();

  // Synchronous copies of the first `bytes` bytes (<= size()) on `stream`.
  absl::Status CopyFromHost(const void* src, size_t bytes,
                            Stream stream = nullptr);
  absl::Status CopyToHost(void* dst, size_t bytes,
                          Stream stream = nullptr) const;
  // Sets every byte to `value` and waits (e.g. 0xFF: NaN in float32 and
  // bfloat16, to poison outputs in tests).
  absl::Status Fill(uint8_t value, Stream stream = nullptr);

 private:
  DeviceAllocator* allocator_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_DEVICE_ALLOCATOR_H_
