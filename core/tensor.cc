#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace trainyard {

struct Tensor::Storage {
  explicit Storage(size_t n) : size(n) {
    // aligned_alloc needs a size that is a multiple of the alignment.
    size_t rounded = (n + 63) / 64 * 64;
    ptr = rounded == 0 ? nullptr : std::aligned_alloc(64, rounded);
    CHECK(rounded == 0 || ptr != nullptr)
        << "out of memory allocating " << n << " bytes";
  }
  ~Storage() { std::free(ptr); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* ptr = nullptr;
  size_t size = 0;
};

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kBFloat16:
      return 2;
    case DType::kInt64:
      return 8;
    case DType::kUInt8:
      return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
  }
  return "unknown";
}

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kInt32,
                  DType::kInt64, DType::kUInt8}) {
    if (DTypeName(d) == name) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name,
                   "\" (expected float32, bfloat16, int32, int64 or uint8)"));
}

std::string Device::ToString() const {
  return is_cpu() ? std::string("cpu") : absl::StrCat("cuda:", index);
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::Empty(DType dtype, Shape shape, Device device) {
  CHECK(device.is_cpu()) << "Tensor::Empty on " << device.ToString()
                         << " needs the CUDA allocator";
  for (int64_t d : shape) CHECK_GE(d, 0) << ShapeToString(shape);
  Tensor t;
  t.dtype_ = dtype;
  t.device_ = device;
  t.shape_ = std::move(shape);
  t.storage_ = std::make_shared<Storage>(t.nbytes());
  return t;
}

Tensor Tensor::Zeros(DType dtype, Shape shape, Device device) {
  Tensor t = Empty(dtype, std::move(shape), device);
  if (t.nbytes() > 0) std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::FromVector(const std::vector<float>& values, Shape shape) {
  CHECK_EQ(static_cast<int64_t>(values.size()), NumElements(shape));
  Tensor t = Empty(DType::kFloat32, std::move(shape));
  if (!values.empty()) {
    std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(float));
  }
  return t;
}

namespace {
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kUInt8;
};
template <>
struct DTypeOf<uint16_t> {
  static constexpr DType value = DType::kBFloat16;
};
}  // namespace

template <typename T>
T* Tensor::data() {
  CHECK(dtype_ == DTypeOf<T>::value)
      << "tensor is " << DTypeName(dtype_) << ", accessed as "
      << DTypeName(DTypeOf<T>::value);
  return static_cast<T*>(raw_data());
}

template <typename T>
const T* Tensor::data() const {
  CHECK(dtype_ == DTypeOf<T>::value)
      << "tensor is " << DTypeName(dtype_) << ", accessed as "
      << DTypeName(DTypeOf<T>::value);
  return static_cast<const T*>(raw_data());
}

template float* Tensor::data<float>();
template const float* Tensor::data<float>() const;
template int32_t* Tensor::data<int32_t>();
template const int32_t* Tensor::data<int32_t>() const;
template int64_t* Tensor::data<int64_t>();
template const int64_t* Tensor::data<int64_t>() const;
template uint8_t* Tensor::data<uint8_t>();
template const uint8_t* Tensor::data<uint8_t>() const;
template uint16_t* Tensor::data<uint16_t>();
template const uint16_t* Tensor::data<uint16_t>() const;

void* Tensor::raw_data() {
  return storage_ ? static_cast<char*>(storage_->ptr) + offset_ : nullptr;
}

const void* Tensor::raw_data() const {
  return storage_ ? static_cast<const char*>(storage_->ptr) + offset_ : nullptr;
}

Tensor Tensor::Rows(int64_t begin, int64_t end) const {
  CHECK_GE(ndim(), 1);
  CHECK(0 <= begin && begin <= end && end <= shape_[0])
      << "rows [" << begin << ", " << end << ") of " << ShapeToString(shape_);
  Tensor t = *this;
  int64_t row_elems = shape_[0] == 0 ? 0 : numel() / shape_[0];
  t.offset_ += static_cast<size_t>(begin * row_elems) * DTypeSize(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::View(Shape shape) const {
  CHECK_EQ(NumElements(shape), numel())
      << ShapeToString(shape) << " vs " << ShapeToString(shape_);
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::Clone() const {
  Tensor t = Empty(dtype_, shape_, device_);
  if (nbytes() > 0) std::memcpy(t.raw_data(), raw_data(), nbytes());
  return t;
}

void Tensor::CopyFrom(const Tensor& src) {
  CHECK(src.dtype_ == dtype_);
  CHECK_EQ(src.numel(), numel());
  if (nbytes() > 0) std::memcpy(raw_data(), src.raw_data(), nbytes());
}

void Tensor::Fill(float value) {
  float* p = data<float>();
  for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = value;
}

}  // namespace trainyard
