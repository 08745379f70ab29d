#include "core/allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/host_info.h"

namespace trainyard {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// -1: not decided yet (the environment decides), else 0 or 1.
std::atomic<int> huge_pages_override{-1};

// 64-byte aligned host memory that keeps freed blocks of 64 KiB to 256 MiB
// for reuse by the next request of the same (4 KiB-rounded) size. A step
// loop allocates the same activation sizes every step; without the cache,
// glibc returns large blocks to the kernel and the next step pays page
// faults to get them back (about 6% of a CPU training step, measured in
// docs/BENCHMARKS.md). Cached bytes are capped; beyond the cap, and for
// small or huge blocks, memory goes straight back to malloc.
class CachingHostAllocator final : public Allocator {
 public:
  CachingHostAllocator() {
    cap_ = std::max<size_t>(size_t{256} << 20,
                            static_cast<size_t>(UsableMemoryBytes() / 8));
  }

  Device device() const override { return Device::Cpu(); }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t size = RoundSize(bytes);
    if (size < bytes) return Exhausted(bytes);  // overflow
    if (Cached(size)) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= size;
        sizes_[p] = size;
        return p;
      }
    }
    void* p = AllocateHostBlock(size);
    if (p == nullptr) {
      // Give the cache back and try once more before refusing.
      EmptyCache();
      p = AllocateHostBlock(size);
      if (p == nullptr) return Exhausted(bytes);
    }
    if (Cached(size)) {
      std::lock_guard<std::mutex> lock(mu_);
      sizes_[p] = size;
    }
    return p;
  }

  void Deallocate(void* ptr) override {
    if (ptr == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sizes_.find(ptr);
      if (it != sizes_.end()) {
        const size_t size = it->second;
        sizes_.erase(it);
        if (cached_bytes_ + size <= cap_) {
          free_[size].push_back(ptr);
          cached_bytes_ += size;
          return;
        }
      }
    }
    std::free(ptr);
  }

 private:
  static constexpr size_t kMinCached = size_t{64} << 10;
  static constexpr size_t kMaxCached = size_t{256} << 20;

  // Cached sizes are rounded to 4 KiB so that near-equal requests share a
  // free list; small ones to the alignment.
  static size_t RoundSize(size_t bytes) {
    const size_t align = bytes >= kMinCached ? 4096 : 64;
    return (bytes + align - 1) / align * align;
  }
  static bool Cached(size_t size) {
    return size >= kMinCached && size <= kMaxCached;
  }
  static absl::Status Exhausted(size_t bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of host memory allocating ", bytes, " bytes"));
  }

  void EmptyCache() override {
    std::vector<void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [size, list] : free_) {
        blocks.insert(blocks.end(), list.begin(), list.end());
      }
      free_.clear();
      cached_bytes_ = 0;
    }
    for (void* p : blocks) std::free(p);
  }

  std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;  // live cacheable blocks
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_bytes_ = 0;
  size_t cap_ = 0;
};

}  // namespace

void Allocator::EmptyCache() {}

void* AllocateHostBlock(size_t bytes) {
  if (bytes < kHugePage) {
    // aligned_alloc wants a multiple of the alignment.
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  void* p = nullptr;
  if (posix_memalign(&p, kHugePage, bytes) != 0) return nullptr;
  if (HostHugePages()) {
    // A hint: where the kernel has no transparent huge pages the call fails
    // and the block stays on small pages, as it would be without it.
    (void)madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);
  }
  return p;
}

bool HostHugePages() {
  const int set = huge_pages_override.load(std::memory_order_relaxed);
  if (set >= 0) return set == 1;
  static const bool from_env = [] {
    const char* env = std::getenv("TRAINYARD_HUGE_PAGES");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return from_env;
}

void SetHostHugePagesForTesting(bool on) {
  huge_pages_override.store(on ? 1 : 0, std::memory_order_relaxed);
}

Allocator* HostAllocator() {
  static Allocator* const kHost = new CachingHostAllocator();
  return kHost;
}

}  // namespace trainyard
