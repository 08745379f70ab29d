// Tensor: a typed, shaped view of a reference-counted buffer on one device.
//
// A Tensor is cheap to copy (copies share storage, like torch.Tensor).
// Views (`Rows`, `View`) share their parent's storage; `Clone` copies.
// Storage comes from an Allocator (core/allocator.h): 64-byte aligned host
// memory by default, or device memory from the CUDA caching allocator.
// Host access (`data<T>()`, `raw_data()`, `Clone`, `CopyFrom`, `Fill`)
// CHECK-fails on a device tensor (a bug: copy it to the host first, see
// kernels/exec_context.h); `ptr()` is the address on whatever device, for
// kernels and copies.
//
// Thread safety: distinct Tensors may be used from distinct threads; writes
// to shared storage must be synchronised by the caller.
#ifndef TRAINYARD_CORE_TENSOR_H_
#define TRAINYARD_CORE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/allocator.h"
#include "core/device.h"

namespace trainyard {

// The numbers are part of the transport frame format
// (docs/TRANSPORT_FRAME.md): append, never renumber.
enum class DType : int32_t {
  kFloat32 = 0,
  kBFloat16 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kUInt8 = 4,
  kFloat64 = 5,
  // IEEE half precision: data features stored at half width, widened to
  // float32 before any block computes on them.
  kFloat16 = 6,
};
constexpr DType kAllDTypes[] = {
    DType::kFloat32, DType::kBFloat16, DType::kInt32,  DType::kInt64,
    DType::kUInt8,   DType::kFloat64,  DType::kFloat16};

// Bytes per element.
size_t DTypeSize(DType dtype);
// "float32", "bfloat16", "int32", "int64", "uint8", "float64", "float16".
absl::string_view DTypeName(DType dtype);
absl::StatusOr<DType> DTypeFromName(absl::string_view name);

using Shape = std::vector<int64_t>;
std::string ShapeToString(const Shape& shape);  // "[2, 3]"
int64_t NumElements(const Shape& shape);

class Tensor {
 public:
  // An empty tensor: dtype float32, shape [0], no storage.
  Tensor() = default;

  // Uninitialised memory from `allocator`. Errors: InvalidArgument for a
  // negative dimension or a size that overflows; ResourceExhausted when
  // the allocator cannot serve it.
  static absl::StatusOr<Tensor> Create(DType dtype, Shape shape,
                                       Allocator* allocator = HostAllocator());

  // Host memory for sizes the program controls (kernel temporaries,
  // tests); CHECK-fails where Create would return an error.
  static Tensor Empty(DType dtype, Shape shape);
  static Tensor Zeros(DType dtype, Shape shape);
  // A float32 tensor holding `values` (row-major) with the given shape.
  static Tensor FromVector(const std::vector<float>& values, Shape shape);

  DType dtype() const { return dtype_; }
  const Device& device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return NumElements(shape_); }
  size_t nbytes() const {
    return static_cast<size_t>(numel()) * DTypeSize(dtype_);
  }
  bool defined() const { return storage_ != nullptr; }

  // Typed host access; CHECK-fails if T does not match dtype() or the
  // tensor is not on the host (bugs).
  template <typename T>
  T* data();
  template <typename T>
  const T* data() const;
  void* raw_data();  // host only
  const void* raw_data() const;

  // The address of the first element on device(), for kernels and copies.
  void* ptr();
  const void* ptr() const;

  // Rows [begin, end) of dimension 0, sharing storage.
  Tensor Rows(int64_t begin, int64_t end) const;
  // The same storage seen with another shape of equal element count.
  Tensor View(Shape shape) const;
  // Host only: a contiguous copy with its own storage.
  Tensor Clone() const;
  // Host only: copies `src` (same dtype and element count) into this
  // tensor's storage.
  void CopyFrom(const Tensor& src);
  void Fill(float value);  // host float32 only

 private:
  // The simulated device's kernels see its memory through host views
  // (core/sim_device.h); nothing else may relabel a tensor.
  friend class SimDeviceAccess;
  // The same storage, shape and offset labelled as being on `device`.
  Tensor Relabeled(Device device) const {
    Tensor t = *this;
    t.device_ = device;
    return t;
  }

  struct Storage;
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes into storage_
  DType dtype_ = DType::kFloat32;
  Device device_;
  Shape shape_ = {0};
};

// Tensors by name, in a meaningful order (parameters, message contents,
// safetensors files).
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

}  // namespace trainyard

#endif  // TRAINYARD_CORE_TENSOR_H_
