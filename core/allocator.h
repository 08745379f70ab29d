// Allocator: where a Tensor's bytes come from. HostAllocator() gives
// 64-byte aligned host memory; the CUDA caching allocator
// (kernels/cuda/device_allocator.h) implements the same interface for
// device memory, so core/ never depends on CUDA.
//
// Allocators live as long as the process (Tensors keep a raw pointer to
// theirs). Thread safety: implementations are thread-safe.
#ifndef TRAINYARD_CORE_ALLOCATOR_H_
#define TRAINYARD_CORE_ALLOCATOR_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "core/device.h"

namespace trainyard {

class Allocator {
 public:
  virtual ~Allocator() = default;

  // The device the memory is on.
  virtual Device device() const = 0;

  // At least `bytes` bytes, aligned to 64 bytes or more; bytes == 0 may
  // return nullptr. Errors: ResourceExhausted naming the size (never a
  // crash: a request sized by user input must be refusable).
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;

  // Returns memory from Allocate; nullptr is a no-op.
  virtual void Deallocate(void* ptr) = 0;

  // Gives cached free memory back to the system (a no-op for allocators
  // that keep none). Jobs call it when they end, so a long-lived worker
  // does not keep an earlier job's free blocks.
  virtual void EmptyCache();
};

// The process-wide host allocator: 64-byte aligned memory; freed blocks of
// 64 KiB to 256 MiB are kept (up to max(256 MiB, usable memory / 8), where
// usable is physical memory or the cgroup's limit if lower) for the next
// request of the same size, so a step loop does not fault its activations'
// pages in again every step.
Allocator* HostAllocator();

}  // namespace trainyard

#endif  // TRAINYARD_CORE_ALLOCATOR_H_
