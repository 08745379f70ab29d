#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace trainyard {

struct Tensor::Storage {
  Storage(Allocator* a, void* p, size_t n) : allocator(a), ptr(p), size(n) {}
  ~Storage() { allocator->Deallocate(ptr); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Allocator* const allocator;
  void* const ptr;
  const size_t size;
};

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kInt64:
    case DType::kFloat64:
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
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
  }
  return "unknown";
}

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  for (DType d : kAllDTypes) {
    if (DTypeName(d) == name) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name,
                   "\" (expected float32, bfloat16, int32, int64, uint8, "
                   "float64 or float16)"));
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<Tensor> Tensor::Create(DType dtype, Shape shape,
                                      Allocator* allocator) {
  uint64_t elements = 1;
  bool overflow = false;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor shape ", ShapeToString(shape), " has a negative dimension"));
    }
    if (d != 0 && elements > (uint64_t{1} << 62) / static_cast<uint64_t>(d)) {
      overflow = true;
    }
    elements *= static_cast<uint64_t>(d);
  }
  if (overflow || elements > (uint64_t{1} << 62) / 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor shape ", ShapeToString(shape), " is too large"));
  }
  Tensor t;
  t.dtype_ = dtype;
  t.device_ = allocator->device();
  t.shape_ = std::move(shape);
  const size_t bytes = t.nbytes();
  absl::StatusOr<void*> p = allocator->Allocate(bytes);
  if (!p.ok()) {
    return absl::Status(
        p.status().code(),
        absl::StrCat("tensor ", DTypeName(dtype), ShapeToString(t.shape_),
                     " on ", t.device_.ToString(), ": ", p.status().message()));
  }
  t.storage_ = std::make_shared<Storage>(allocator, *p, bytes);
  return t;
}

Tensor Tensor::Empty(DType dtype, Shape shape) {
  absl::StatusOr<Tensor> t = Create(dtype, std::move(shape));
  CHECK(t.ok()) << t.status();
  return *std::move(t);
}

Tensor Tensor::Zeros(DType dtype, Shape shape) {
  Tensor t = Empty(dtype, std::move(shape));
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
struct DTypeOf<double> {
  static constexpr DType value = DType::kFloat64;
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
template double* Tensor::data<double>();
template const double* Tensor::data<double>() const;
template uint16_t* Tensor::data<uint16_t>();
template const uint16_t* Tensor::data<uint16_t>() const;

void* Tensor::ptr() {
  return storage_ ? static_cast<char*>(storage_->ptr) + offset_ : nullptr;
}

const void* Tensor::ptr() const {
  return storage_ ? static_cast<const char*>(storage_->ptr) + offset_ : nullptr;
}

void* Tensor::raw_data() {
  CHECK(device_.is_cpu()) << "host access to a tensor on "
                          << device_.ToString();
  return ptr();
}

const void* Tensor::raw_data() const {
  CHECK(device_.is_cpu()) << "host access to a tensor on "
                          << device_.ToString();
  return ptr();
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
  Tensor t = Empty(dtype_, shape_);
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
