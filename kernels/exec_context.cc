#include "kernels/exec_context.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "core/bfloat16.h"
#include "core/npy.h"
#include "core/sim_device.h"
#include "core/status_macros.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/cuda/runtime.h"
#include "kernels/parallel.h"

namespace trainyard {
namespace {

// The CUDA caching allocator behind core's Allocator interface.
class CudaTensorAllocator final : public Allocator {
 public:
  CudaTensorAllocator(int index, gpu::DeviceAllocator* cache)
      : index_(index), cache_(cache) {}
  Device device() const override { return Device::Cuda(index_); }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    return cache_->Allocate(bytes);
  }
  void Deallocate(void* ptr) override {
    if (ptr != nullptr) cache_->Free(ptr).IgnoreError();
  }
  void EmptyCache() override { cache_->EmptyCache().IgnoreError(); }

 private:
  const int index_;
  gpu::DeviceAllocator* const cache_;
};

// Page-locked host memory (gpu::AllocPinned), uncached: a stage allocates
// its pinned buffers once.
class PinnedHostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cpu(); }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    return gpu::AllocPinned(bytes);
  }
  void Deallocate(void* ptr) override { gpu::FreePinned(ptr); }
};

Allocator* PinnedAllocator() {
  static Allocator* const a = new PinnedHostAllocator();
  return a;
}

// The compute stream of each GPU, for the life of the process.
absl::StatusOr<gpu::Stream> CudaStreamFor(int index) {
  static std::mutex mu;
  static auto* const streams = new std::map<int, gpu::Stream>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams->find(index);
  if (it != streams->end()) return it->second;
  ASSIGN_OR_RETURN(gpu::Stream s, gpu::CreateStream(index));
  (*streams)[index] = s;
  return s;
}

// One Allocator per GPU for the life of the process.
absl::StatusOr<Allocator*> CudaAllocatorFor(int index) {
  static std::mutex mu;
  static auto* const allocators = new std::map<int, Allocator*>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocators->find(index);
  if (it != allocators->end()) return it->second;
  ASSIGN_OR_RETURN(gpu::DeviceAllocator * cache,
                   gpu::DeviceAllocator::ForDevice(index));
  Allocator* a = new CudaTensorAllocator(index, cache);
  (*allocators)[index] = a;
  return a;
}

// Calls fn(begin, end) over consecutive ranges covering [0, n), split
// across the compute threads when n is large. The split depends on n only,
// and element-wise work gives the same bits however it is split.
void ForEachRange(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int64_t tasks = std::min<int64_t>(chunks, ComputeThreads());
  if (tasks <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  ParallelFor(static_cast<int>(tasks),
              [&](int t) { fn(n * t / tasks, n * (t + 1) / tasks); });
}

// dst[i] += src[i] for n floats on the host.
void AddFloats(int64_t n, const float* s, float* d) {
  ForEachRange(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) d[i] += s[i];
  });
}

// The conversions Cast performs (see exec_context.h).
enum class CastKind { kFloatToBf16, kBf16ToFloat, kHalfToFloat, kHalfToBf16 };

// The cast from `from` to `to` (different dtypes) on `device`.
// InvalidArgument naming both dtypes for any other pair, and for narrowing
// float32 to bfloat16 on the CPU, which computes in float32 only.
absl::StatusOr<CastKind> CastKindOf(DType from, DType to,
                                    const Device& device) {
  const auto pair = [&](DType a, DType b) { return from == a && to == b; };
  const std::string what =
      absl::StrCat("cast from ", DTypeName(from), " to ", DTypeName(to), " on ",
                   device.ToString());
  if (pair(DType::kFloat32, DType::kBFloat16)) {
    if (device.is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what,
          ": the CPU computes in float32 (precision fp32); it only "
          "widens"));
    }
    return CastKind::kFloatToBf16;
  }
  if (pair(DType::kBFloat16, DType::kFloat32)) return CastKind::kBf16ToFloat;
  if (pair(DType::kFloat16, DType::kFloat32)) return CastKind::kHalfToFloat;
  if (pair(DType::kFloat16, DType::kBFloat16)) return CastKind::kHalfToBf16;
  return absl::InvalidArgumentError(absl::StrCat(
      what,
      ": only float32 -> bfloat16, bfloat16 -> float32, float16 -> "
      "float32 and float16 -> bfloat16"));
}

// dst[i] = convert(src[i]) for n elements of host memory.
template <typename From, typename To, typename Convert>
void ConvertOnHost(int64_t n, const void* src, void* dst, Convert convert) {
  const From* s = static_cast<const From*>(src);
  To* d = static_cast<To*>(dst);
  ForEachRange(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) d[i] = convert(s[i]);
  });
}

// The cast `kind` of n elements in host memory (the CPU's or the simulated
// device's): the same bits as the CUDA kernels, but for the payload of a
// float16 NaN widened to float32 (kept here, canonical there).
void CastOnHost(CastKind kind, int64_t n, const void* src, void* dst) {
  switch (kind) {
    case CastKind::kFloatToBf16:
      return ConvertOnHost<float, uint16_t>(n, src, dst, FloatToBf16);
    case CastKind::kBf16ToFloat:
      return ConvertOnHost<uint16_t, float>(n, src, dst, Bf16ToFloat);
    case CastKind::kHalfToFloat:
      return ConvertOnHost<uint16_t, float>(n, src, dst, Float16ToFloat);
    case CastKind::kHalfToBf16:
      return ConvertOnHost<uint16_t, uint16_t>(n, src, dst, [](uint16_t h) {
        return FloatToBf16(Float16ToFloat(h));
      });
  }
}

// The cast `kind` of n elements in GPU memory, queued on `stream`.
absl::Status CastOnGpu(CastKind kind, int64_t n, const void* src, void* dst,
                       gpu::Stream stream) {
  switch (kind) {
    case CastKind::kFloatToBf16:
      return gpu::CastFloatToBf16(n, static_cast<const float*>(src), dst,
                                  stream);
    case CastKind::kBf16ToFloat:
      return gpu::CastBf16ToFloat(n, src, static_cast<float*>(dst), stream);
    case CastKind::kHalfToFloat:
      return gpu::CastFloat16ToFloat(n, src, static_cast<float*>(dst), stream);
    case CastKind::kHalfToBf16:
      return gpu::CastFloat16ToBf16(n, src, dst, stream);
  }
  return absl::InternalError("CastOnGpu: unknown cast");
}

}  // namespace

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kTf32:
      return "tf32";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

absl::StatusOr<Precision> PrecisionFromName(absl::string_view name) {
  for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16}) {
    if (name == PrecisionName(p)) return p;
  }
  std::string shown(name.substr(0, 64));
  return absl::InvalidArgumentError(absl::StrCat(
      "precision \"", shown, "\": expected \"fp32\", \"tf32\" or \"bf16\""));
}

absl::StatusOr<std::unique_ptr<ExecContext>> ExecContext::Create(
    Device device, Precision precision) {
  if (device.is_cpu()) {
    if (precision != Precision::kFp32) {
      return absl::InvalidArgumentError(
          absl::StrCat("precision ", PrecisionName(precision),
                       " needs a CUDA device; the CPU computes in fp32"));
    }
    return std::unique_ptr<ExecContext>(
        new ExecContext(device, precision, HostAllocator(), nullptr));
  }
  if (device.is_sim()) {
    if (precision == Precision::kTf32) {
      return absl::InvalidArgumentError(
          "precision tf32 needs a CUDA device; the simulated device computes "
          "in fp32 (or bf16 activations)");
    }
    return std::unique_ptr<ExecContext>(new ExecContext(
        device, precision, SimAllocator(device.index), nullptr));
  }
  absl::Status usable = gpu::CheckDevice(device.index);
  if (!usable.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(device.ToString(), " is not usable: ", usable.message()));
  }
  RETURN_IF_ERROR(gpu::SetDevice(device.index));
  ASSIGN_OR_RETURN(Allocator * allocator, CudaAllocatorFor(device.index));
  ASSIGN_OR_RETURN(gpu::Stream stream, CudaStreamFor(device.index));
  return std::unique_ptr<ExecContext>(
      new ExecContext(device, precision, allocator, stream));
}

std::string ExecContext::ToString() const {
  return absl::StrCat(device_.ToString(), " ", PrecisionName(precision_));
}

absl::Status ExecContext::Activate() const {
  if (!device_.is_cuda()) return absl::OkStatus();
  return gpu::SetDevice(device_.index);
}

absl::StatusOr<Tensor> ExecContext::Empty(DType dtype, Shape shape) const {
  return Tensor::Create(dtype, std::move(shape), allocator_);
}

absl::StatusOr<Tensor> ExecContext::Zeros(DType dtype, Shape shape) const {
  ASSIGN_OR_RETURN(Tensor t, Empty(dtype, std::move(shape)));
  RETURN_IF_ERROR(SetZero(&t));
  return t;
}

absl::Status ExecContext::SetZero(Tensor* t) const {
  if (t->device() != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat("zeroing a tensor on ", t->device().ToString(),
                     " in a context on ", device_.ToString()));
  }
  if (t->nbytes() == 0) return absl::OkStatus();
  if (!device_.is_cuda()) {
    std::memset(t->ptr(), 0, t->nbytes());
    return absl::OkStatus();
  }
  return gpu::MemsetAsync(t->ptr(), 0, t->nbytes(), stream());
}

absl::Status ExecContext::CopyInto(const Tensor& src, Tensor* dst) const {
  if (src.dtype() != dst->dtype() || src.numel() != dst->numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy of ", DTypeName(src.dtype()), ShapeToString(src.shape()),
        " into ", DTypeName(dst->dtype()), ShapeToString(dst->shape())));
  }
  const size_t n = src.nbytes();
  if (n == 0) return absl::OkStatus();
  const bool from_host = src.device().is_cpu();
  const bool to_host = dst->device().is_cpu();
  if (from_host != to_host) CountCopy(/*to_device=*/from_host, n, true);
  // The simulated device's memory is host memory: every copy is a memcpy.
  if (!src.device().is_cuda() && !dst->device().is_cuda()) {
    std::memcpy(dst->ptr(), src.ptr(), n);
  } else if (from_host) {
    RETURN_IF_ERROR(gpu::CopyHostToDevice(dst->ptr(), src.ptr(), n, stream()));
  } else if (to_host) {
    RETURN_IF_ERROR(gpu::CopyDeviceToHost(dst->ptr(), src.ptr(), n, stream()));
  } else {
    RETURN_IF_ERROR(
        gpu::CopyDeviceToDevice(dst->ptr(), src.ptr(), n, stream()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ExecContext::PinnedEmpty(DType dtype,
                                                Shape shape) const {
  return Tensor::Create(
      dtype, std::move(shape),
      device_.is_cuda() ? PinnedAllocator() : HostAllocator());
}

absl::Status ExecContext::CopyAsync(bool to_device, const Tensor& src,
                                    Tensor* dst) const {
  const Tensor& host = to_device ? src : *dst;
  const Tensor& device = to_device ? *dst : src;
  if (host.dtype() != device.dtype() || host.numel() != device.numel() ||
      !host.device().is_cpu() || device.device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "asynchronous copy to the ", to_device ? "device" : "host", " between ",
        DTypeName(host.dtype()), ShapeToString(host.shape()), " on ",
        host.device().ToString(), " and ", DTypeName(device.dtype()),
        ShapeToString(device.shape()), " on ", device.device().ToString(),
        " in a context on ", device_.ToString()));
  }
  const size_t n = src.nbytes();
  if (n == 0 || device_.is_cpu()) {
    if (n > 0 && src.ptr() != dst->ptr()) std::memcpy(dst->ptr(), src.ptr(), n);
    return absl::OkStatus();
  }
  CountCopy(to_device, n, /*waits=*/false);
  if (device_.is_sim()) {
    std::memcpy(dst->ptr(), src.ptr(), n);
    return absl::OkStatus();
  }
  return to_device
             ? gpu::CopyHostToDeviceAsync(dst->ptr(), src.ptr(), n, stream())
             : gpu::CopyDeviceToHostAsync(dst->ptr(), src.ptr(), n, stream());
}

absl::Status ExecContext::CopyToDeviceAsync(const Tensor& src,
                                            Tensor* dst) const {
  return CopyAsync(/*to_device=*/true, src, dst);
}

absl::Status ExecContext::CopyToHostAsync(const Tensor& src,
                                          Tensor* dst) const {
  return CopyAsync(/*to_device=*/false, src, dst);
}

absl::StatusOr<Tensor> ExecContext::HostCopy(const Tensor& t) const {
  ASSIGN_OR_RETURN(Tensor host, Tensor::Create(t.dtype(), t.shape()));
  RETURN_IF_ERROR(CopyInto(t, &host));
  return host;
}

absl::StatusOr<Tensor> ExecContext::ToHost(const Tensor& t) const {
  if (t.device().is_cpu()) return t;
  return HostCopy(t);
}

absl::StatusOr<Tensor> ExecContext::ToDevice(const Tensor& t) const {
  if (t.device() == device_) return t;
  ASSIGN_OR_RETURN(Tensor out, Empty(t.dtype(), t.shape()));
  RETURN_IF_ERROR(CopyInto(t, &out));
  return out;
}

absl::StatusOr<Tensor> ExecContext::Cast(const Tensor& t, DType dtype) const {
  if (t.dtype() == dtype) return t;
  ASSIGN_OR_RETURN(Tensor out, Empty(dtype, t.shape()));
  RETURN_IF_ERROR(CastInto(t, &out));
  return out;
}

absl::Status ExecContext::AddInto(const Tensor& src, Tensor* dst) const {
  if (src.dtype() != DType::kFloat32 || dst->dtype() != DType::kFloat32 ||
      src.numel() != dst->numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "add of ", DTypeName(src.dtype()), ShapeToString(src.shape()), " into ",
        DTypeName(dst->dtype()), ShapeToString(dst->shape()),
        ": float32 of the same size only"));
  }
  if (src.device() != device_ || dst->device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "add of a tensor on ", src.device().ToString(), " into one on ",
        dst->device().ToString(), " in a context on ", device_.ToString()));
  }
  const int64_t n = src.numel();
  if (n == 0) return absl::OkStatus();
  if (!device_.is_cuda()) {
    AddFloats(n, static_cast<const float*>(src.ptr()),
              static_cast<float*>(dst->ptr()));
    return absl::OkStatus();
  }
  return gpu::AddBiasResidual(DType::kFloat32, 1, n, /*bias=*/nullptr,
                              src.ptr(), dst->ptr(), stream());
}

absl::Status ExecContext::CastInto(const Tensor& src, Tensor* dst) const {
  if (src.dtype() == dst->dtype()) return CopyInto(src, dst);
  if (src.device() != device_ || dst->device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cast of a tensor on ", src.device().ToString(), " into one on ",
        dst->device().ToString(), " in a context on ", device_.ToString()));
  }
  if (src.numel() != dst->numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cast of ", ShapeToString(src.shape()), " into ",
                     ShapeToString(dst->shape())));
  }
  ASSIGN_OR_RETURN(CastKind kind,
                   CastKindOf(src.dtype(), dst->dtype(), device_));
  if (!device_.is_cuda()) {
    CastOnHost(kind, src.numel(), src.ptr(), dst->ptr());
    return absl::OkStatus();
  }
  return CastOnGpu(kind, src.numel(), src.ptr(), dst->ptr(), stream());
}

absl::Status ExecContext::Synchronize() const {
  if (device_.is_cpu()) return absl::OkStatus();
  syncs_.fetch_add(1, std::memory_order_relaxed);
  if (device_.is_sim()) return absl::OkStatus();  // nothing is ever pending
  return gpu::StreamSynchronize(stream());
}

absl::StatusOr<int64_t> ExecContext::FreeMemoryBytes() const {
  if (!device_.is_cuda()) return std::numeric_limits<int64_t>::max();
  ASSIGN_OR_RETURN(gpu::MemoryInfo info, gpu::GetMemoryInfo(device_.index));
  return static_cast<int64_t>(info.free_bytes);
}

void ExecContext::CountCopy(bool to_device, size_t bytes, bool waits) const {
  const int64_t n = static_cast<int64_t>(bytes);
  if (to_device) {
    h2d_copies_.fetch_add(1, std::memory_order_relaxed);
    h2d_bytes_.fetch_add(n, std::memory_order_relaxed);
  } else {
    d2h_copies_.fetch_add(1, std::memory_order_relaxed);
    d2h_bytes_.fetch_add(n, std::memory_order_relaxed);
  }
  if (waits) syncs_.fetch_add(1, std::memory_order_relaxed);
}

DeviceTraffic ExecContext::traffic() const {
  DeviceTraffic t;
  t.h2d_copies = h2d_copies_.load(std::memory_order_relaxed);
  t.h2d_bytes = h2d_bytes_.load(std::memory_order_relaxed);
  t.d2h_copies = d2h_copies_.load(std::memory_order_relaxed);
  t.d2h_bytes = d2h_bytes_.load(std::memory_order_relaxed);
  t.syncs = syncs_.load(std::memory_order_relaxed);
  return t;
}

}  // namespace trainyard
