// Tensor: a typed, shaped view of a reference-counted buffer.
//
// A Tensor is cheap to copy (copies share storage, like torch.Tensor).
// Views (`Rows`, `View`) share their parent's storage; `Clone` copies.
// Storage is 64-byte aligned host memory for Device::Cpu(); CUDA storage
// arrives with the GPU path without changing callers, which only see
// dtype(), device(), shape() and data<T>().
//
// Thread safety: distinct Tensors may be used from distinct threads; writes
// to shared storage must be synchronised by the caller.
#ifndef TRAINYARD_CORE_TENSOR_H_
#define TRAINYARD_CORE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

enum class DType : int32_t {
  kFloat32 = 0,
  kBFloat16 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kUInt8 = 4,
};

// Bytes per element.
size_t DTypeSize(DType dtype);
// "float32", "bfloat16", "int32", "int64", "uint8".
absl::string_view DTypeName(DType dtype);
absl::StatusOr<DType> DTypeFromName(absl::string_view name);

struct Device {
  enum class Kind : int32_t { kCpu = 0, kCuda = 1 };
  Kind kind = Kind::kCpu;
  int32_t index = 0;

  static Device Cpu() { return Device{}; }
  static Device Cuda(int32_t index) { return Device{Kind::kCuda, index}; }
  bool is_cpu() const { return kind == Kind::kCpu; }
  std::string ToString() const;  // "cpu" or "cuda:N"
  bool operator==(const Device& o) const {
    return kind == o.kind && index == o.index;
  }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

using Shape = std::vector<int64_t>;
std::string ShapeToString(const Shape& shape);  // "[2, 3]"
int64_t NumElements(const Shape& shape);

class Tensor {
 public:
  // An empty tensor: dtype float32, shape [0], no storage.
  Tensor() = default;

  // Uninitialised memory. CHECK-fails only on impossible shapes (negative).
  static Tensor Empty(DType dtype, Shape shape, Device device = Device::Cpu());
  static Tensor Zeros(DType dtype, Shape shape, Device device = Device::Cpu());
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

  // Typed access; CHECK-fails if T does not match dtype() (a bug).
  template <typename T>
  T* data();
  template <typename T>
  const T* data() const;
  void* raw_data();
  const void* raw_data() const;

  // Rows [begin, end) of dimension 0, sharing storage.
  Tensor Rows(int64_t begin, int64_t end) const;
  // The same storage seen with another shape of equal element count.
  Tensor View(Shape shape) const;
  // A contiguous copy with its own storage.
  Tensor Clone() const;
  // Copies `src` (same dtype and element count) into this tensor's storage.
  void CopyFrom(const Tensor& src);
  void Fill(float value);  // float32 only

 private:
  struct Storage;
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes into storage_
  DType dtype_ = DType::kFloat32;
  Device device_;
  Shape shape_ = {0};
};

}  // namespace trainyard

#endif  // TRAINYARD_CORE_TENSOR_H_
