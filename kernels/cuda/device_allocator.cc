#include "kernels/cuda/device_allocator.h"

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/cuda_status.h"

namespace trainyard {
namespace gpu {

struct DeviceAllocator::State {
  mutable absl::Mutex mu;
  // size class -> free blocks of that class.
  std::map<size_t, std::vector<void*>> free_lists ABSL_GUARDED_BY(mu);
  // live block -> its size class.
  absl::flat_hash_map<void*, size_t> live ABSL_GUARDED_BY(mu);
  AllocatorStats stats ABSL_GUARDED_BY(mu);
};

namespace {

// Runs cuda calls with `device` current, restoring the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

absl::Status EmptyCacheLocked(int device, DeviceAllocator* self,
                              std::map<size_t, std::vector<void*>>* lists,
                              AllocatorStats* stats) {
  DeviceGuard guard(device);
  for (auto& [size, blocks] : *lists) {
    while (!blocks.empty()) {
      CUDA_RETURN_IF_ERROR(cudaFree(blocks.back()));
      blocks.pop_back();
      stats->bytes_cached -= static_cast<int64_t>(size);
    }
  }
  lists->clear();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeviceAllocator*> DeviceAllocator::ForDevice(int device) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* allocators = new std::map<int, DeviceAllocator*>();
  absl::Status ok = CheckDevice(device);
  if (!ok.ok()) {
    return absl::Status(
        ok.code(),
        absl::StrCat("DeviceAllocator for cuda:", device, ": ", ok.message()));
  }
  absl::MutexLock lock(&mu);
  DeviceAllocator*& a = (*allocators)[device];
  if (a == nullptr) {
    a = new DeviceAllocator(device);
    a->state_ = new State();
  }
  return a;
}

absl::StatusOr<void*> DeviceAllocator::Allocate(size_t bytes) {
  const size_t size = RoundSize(bytes);
  absl::MutexLock lock(&state_->mu);
  AllocatorStats& st = state_->stats;
  void* ptr = nullptr;
  auto it = state_->free_lists.find(size);
  if (it != state_->free_lists.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    st.bytes_cached -= static_cast<int64_t>(size);
    ++st.cache_hits;
  } else {
    DeviceGuard guard(device_);
    cudaError_t e = cudaMalloc(&ptr, size);
    if (e == cudaErrorMemoryAllocation && st.bytes_cached > 0) {
      cudaGetLastError();
      absl::Status s =
          EmptyCacheLocked(device_, this, &state_->free_lists, &st);
      if (!s.ok()) return s;
      e = cudaMalloc(&ptr, size);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      return CudaErrorToStatus(
          e,
          absl::StrCat("cudaMalloc(", size, " bytes) on cuda:", device_,
                       " with ", st.bytes_in_use, " bytes in use"),
          __FILE__, __LINE__);
    }
    ++st.device_mallocs;
  }
  state_->live[ptr] = size;
  ++st.allocations;
  st.bytes_in_use += static_cast<int64_t>(size);
  if (st.bytes_in_use > st.peak_bytes_in_use) {
    st.peak_bytes_in_use = st.bytes_in_use;
  }
  return ptr;
}

absl::Status DeviceAllocator::Free(void* ptr) {
  if (ptr == nullptr) return absl::OkStatus();
  absl::MutexLock lock(&state_->mu);
  auto it = state_->live.find(ptr);
  if (it == state_->live.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceAllocator(cuda:", device_, ")::Free: pointer ",
                     reinterpret_cast<uintptr_t>(ptr),
                     " was not allocated here or was already freed"));
  }
  const size_t size = it->second;
  state_->live.erase(it);
  state_->free_lists[size].push_back(ptr);
  state_->stats.bytes_in_use -= static_cast<int64_t>(size);
  state_->stats.bytes_cached += static_cast<int64_t>(size);
  return absl::OkStatus();
}

absl::Status DeviceAllocator::EmptyCache() {
  absl::MutexLock lock(&state_->mu);
  return EmptyCacheLocked(device_, this, &state_->free_lists, &state_->stats);
}

AllocatorStats DeviceAllocator::stats() const {
  absl::MutexLock lock(&state_->mu);
  return state_->stats;
}

}  // namespace gpu
}  // namespace trainyard
