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

// The process-wide host allocator: blocks from AllocateHostBlock; freed
// blocks of 64 KiB to 256 MiB are kept (up to max(256 MiB, usable memory /
// 8), where usable is physical memory or the cgroup's limit if lower) for
// the next request of the same size, so a step loop does not fault its
// activations' pages in again every step.
Allocator* HostAllocator();

// Host memory straight from the system, for the host allocator's blocks
// and for large buffers kept outside an Allocator (the packed GEMM's
// weight panels): 64-byte aligned; a block of 2 MiB or more starts on a
// 2 MiB boundary and, while HostHugePages() is on, its whole 2 MiB pages
// are marked for transparent huge pages (madvise MADV_HUGEPAGE; the kernel
// honours it when /sys/kernel/mm/transparent_hugepage/enabled is "always"
// or "madvise"). A training step streams every weight once a microbatch
// and the optimizer its 28 bytes a parameter: on 4 KiB pages a 16 MiB
// weight is 4096 TLB misses a pass, on 2 MiB pages 8 (the step's gain is
// in docs/BENCHMARKS.md). Returns nullptr when the memory cannot be had;
// release with std::free.
void* AllocateHostBlock(size_t bytes);

// Whether AllocateHostBlock asks for huge pages: yes unless the
// environment variable TRAINYARD_HUGE_PAGES is "0" (read once per process).
bool HostHugePages();

// Tests and benchmarks only: overrides HostHugePages() for later blocks.
void SetHostHugePagesForTesting(bool on);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_ALLOCATOR_H_
