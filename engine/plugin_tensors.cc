#include "engine/plugin_tensors.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace trainyard {
namespace {

// Refuse single allocations and per-call totals beyond these: a plugin asking
// for absurd sizes must get NULL, not take the host down with an OOM abort.
constexpr int64_t kMaxTensorBytes = int64_t{1} << 32;   // 4 GiB
constexpr int64_t kMaxCallBytes = int64_t{1} << 33;     // 8 GiB
constexpr size_t kMaxStateDictBytes = size_t{1} << 30;  // 1 GiB

// The host dtype of a tensor a plugin adds (float32, int32, int64).
bool FromAbiDType(int32_t dtype, DType* out) {
  switch (dtype) {
    case TRAINYARD_FLOAT32:
      *out = DType::kFloat32;
      return true;
    case TRAINYARD_INT32:
      *out = DType::kInt32;
      return true;
    case TRAINYARD_INT64:
      *out = DType::kInt64;
      return true;
    default:
      return false;
  }
}

// The ABI dtype of a tensor the host passes in; -1 when the ABI does not
// take it (bfloat16 only on the device).
int32_t ToAbiDType(DType dtype, bool on_device) {
  switch (dtype) {
    case DType::kFloat32:
      return TRAINYARD_FLOAT32;
    case DType::kBFloat16:
      return on_device ? TRAINYARD_BFLOAT16 : -1;
    case DType::kInt32:
      return TRAINYARD_INT32;
    case DType::kInt64:
      return TRAINYARD_INT64;
    default:
      return -1;
  }
}

// The bytes of a `dt` tensor of `shape`; above kMaxTensorBytes it may be
// any larger number (no overflow), and -1 for a negative dimension.
int64_t TensorBytes(DType dt, const Shape& shape) {
  int64_t bytes = static_cast<int64_t>(DTypeSize(dt));
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d > 0 && bytes > kMaxTensorBytes / d) {
      bytes = kMaxTensorBytes + 1;
    } else {
      bytes *= d;
    }
  }
  return bytes;
}

}  // namespace

HostSink::HostSink(bool allow_tensors, bool allow_metrics, bool allow_bytes)
    : allow_tensors_(allow_tensors),
      allow_metrics_(allow_metrics),
      allow_bytes_(allow_bytes) {
  abi_.ctx = this;
  abi_.add_tensor = &HostSink::AddTensorThunk;
  abi_.add_metric = &HostSink::AddMetricThunk;
  abi_.add_bytes = &HostSink::AddBytesThunk;
}

void* HostSink::AddTensorThunk(void* ctx, const char* name, int32_t dtype,
                               int32_t ndim, const int64_t* shape) {
  return static_cast<HostSink*>(ctx)->AddTensor(name, dtype, ndim, shape);
}

void HostSink::AddMetricThunk(void* ctx, const char* name, double value) {
  static_cast<HostSink*>(ctx)->AddMetric(name, value);
}

void HostSink::AddBytesThunk(void* ctx, const void* data, size_t len) {
  static_cast<HostSink*>(ctx)->AddBytes(data, len);
}

void* HostSink::AddTensor(const char* name, int32_t dtype, int32_t ndim,
                          const int64_t* shape) {
  if (!allow_tensors_) {
    Refuse("sink misuse: add_tensor is not allowed in this call");
    return nullptr;
  }
  if (name == nullptr || name[0] == '\0') {
    Refuse("sink misuse: add_tensor with a NULL or empty name");
    return nullptr;
  }
  const std::string n(name);
  DType dt;
  if (!FromAbiDType(dtype, &dt)) {
    Refuse(absl::StrCat("sink misuse: add_tensor \"", n,
                        "\": unsupported dtype ", dtype,
                        " (expected 0 float32, 2 int32 or 3 int64)"));
    return nullptr;
  }
  if (ndim < 0 || ndim > TRAINYARD_MAX_DIMS) {
    Refuse(absl::StrCat("sink misuse: add_tensor \"", n, "\": ndim ", ndim,
                        " outside [0, ", TRAINYARD_MAX_DIMS, "]"));
    return nullptr;
  }
  if (ndim > 0 && shape == nullptr) {
    Refuse(absl::StrCat("sink misuse: add_tensor \"", n,
                        "\": NULL shape with ndim ", ndim));
    return nullptr;
  }
  Shape s(shape, shape + ndim);
  const int64_t bytes = TensorBytes(dt, s);
  if (bytes < 0) {
    Refuse(absl::StrCat("sink misuse: add_tensor \"", n,
                        "\": negative dimension in shape ", ShapeToString(s)));
    return nullptr;
  }
  if (bytes > kMaxTensorBytes || call_bytes_ + bytes > kMaxCallBytes) {
    Refuse(absl::StrCat("sink misuse: add_tensor \"", n, "\": shape ",
                        ShapeToString(s), " exceeds the host's limit of ",
                        kMaxTensorBytes, " bytes per tensor / ", kMaxCallBytes,
                        " per call"));
    return nullptr;
  }
  if (!names_.insert(n).second) {
    Refuse(absl::StrCat("sink misuse: duplicate tensor name \"", n, "\""));
    return nullptr;
  }
  call_bytes_ += bytes;
  Tensor t = Tensor::Zeros(dt, s);
  tensors_.emplace_back(n, t);
  if (bytes == 0) {
    // The ABI reserves NULL for refusal; give empty tensors a valid
    // address that must never be written through.
    alignas(64) static char empty[64];
    return empty;
  }
  return t.raw_data();
}

void HostSink::AddMetric(const char* name, double value) {
  if (!allow_metrics_) {
    Refuse("sink misuse: add_metric is not allowed in this call");
    return;
  }
  if (name == nullptr || name[0] == '\0') {
    Refuse("sink misuse: add_metric with a NULL or empty name");
    return;
  }
  const std::string n(name);
  if (!std::isfinite(value)) {
    Refuse(absl::StrCat("metric \"", n, "\" is not finite: ", value));
    return;
  }
  if (!names_.insert(n).second) {
    Refuse(absl::StrCat("sink misuse: duplicate metric name \"", n, "\""));
    return;
  }
  metrics_.emplace_back(n, value);
}

void HostSink::AddBytes(const void* data, size_t len) {
  if (!allow_bytes_) {
    Refuse("sink misuse: add_bytes is not allowed in this call");
    return;
  }
  if (len == 0) return;
  if (data == nullptr) {
    Refuse(
        absl::StrCat("sink misuse: add_bytes with NULL data and length ", len));
    return;
  }
  if (len > kMaxStateDictBytes - bytes_.size()) {
    Refuse(absl::StrCat("add_bytes: state exceeds the host's limit of ",
                        kMaxStateDictBytes, " bytes"));
    return;
  }
  bytes_.append(static_cast<const char*>(data), len);
}

absl::Status AbiTensors::Add(const std::string& name, const Tensor& t,
                             const std::string& prefix, bool on_device) {
  if (on_device == t.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "tensor \"", name, "\" is on ", t.device().ToString(),
        on_device ? "; compute_loss_device takes device tensors"
                  : "; the plugin ABI takes host tensors"));
  }
  const int32_t dtype = ToAbiDType(t.dtype(), on_device);
  if (dtype < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "tensor \"", name, "\" has dtype ",
                     DTypeName(t.dtype()), "; the plugin ABI takes float32, ",
                     on_device ? "bfloat16, " : "", "int32 or int64"));
  }
  if (t.ndim() > TRAINYARD_MAX_DIMS) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "tensor \"", name, "\" has ", t.ndim(),
                     " dims; the plugin ABI allows ", TRAINYARD_MAX_DIMS));
  }
  names_.push_back(std::make_unique<std::string>(name));
  TrainyardTensor a;
  std::memset(&a, 0, sizeof(a));
  a.name = names_.back()->c_str();
  a.dtype = dtype;
  a.ndim = t.ndim();
  for (int i = 0; i < t.ndim(); ++i) a.shape[i] = t.dim(i);
  a.data = const_cast<void*>(t.ptr());
  tensors_.push_back(a);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> AddBatchTensors(const std::string& prefix,
                                        const NamedTensors& batch,
                                        AbiTensors* abi) {
  if (batch.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "empty batch"));
  }
  int64_t b = -1;
  std::set<std::string> seen;
  for (const auto& [name, t] : batch) {
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "duplicate batch tensor \"", name, "\""));
    }
    if (t.ndim() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "batch tensor \"", name, "\" must have rank >= 1"));
    }
    if (b < 0) b = t.dim(0);
    if (t.dim(0) != b) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "batch tensor \"", name, "\" has ", t.dim(0),
          " rows, expected ", b, " like \"", batch[0].first, "\""));
    }
    RETURN_IF_ERROR(abi->Add(name, t, prefix));
  }
  return b;
}

absl::Status LossTensors::AddOutputAndState(const std::string& prefix,
                                            const Tensor& output,
                                            const NamedTensors& state,
                                            const Device* device) {
  on_device_ = device != nullptr;
  const int64_t b = output.dim(0);
  RETURN_IF_ERROR(output_.Add("output", output, prefix, on_device_));
  for (const auto& [name, t] : state) {
    const bool rows_ok = t.ndim() >= 1 && t.dim(0) == b;
    if (device == nullptr && !rows_ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "state tensor \"", name, "\" has shape ",
                       ShapeToString(t.shape()),
                       "; dim 0 must equal the microbatch size ", b));
    }
    if (device != nullptr && (!rows_ok || t.device() != *device)) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "state tensor \"", name, "\" is ", ShapeToString(t.shape()),
          " on ", t.device().ToString(), "; dim 0 must equal the microbatch ",
          "size ", b, " on ", device->ToString()));
    }
    RETURN_IF_ERROR(state_.Add(name, t, prefix, on_device_));
  }
  return absl::OkStatus();
}

absl::Status LossTensors::AddGradOutput(const std::string& prefix,
                                        const Tensor* grad_output,
                                        const Tensor& output) {
  if (grad_output != nullptr) {
    return grad_.Add("grad_output", *grad_output, prefix, on_device_);
  }
  RETURN_IF_ERROR(grad_.Add("grad_output", output, prefix, on_device_));
  grad_.at(0).data = nullptr;
  return absl::OkStatus();
}

}  // namespace trainyard
