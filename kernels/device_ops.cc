#include "kernels/device_ops.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/bfloat16.h"
#include "core/status_macros.h"
#include "kernels/cuda/step_kernels.h"

namespace trainyard {
namespace {

absl::Status OnDevice(const ExecContext& ctx, const char* what,
                      const Tensor& t) {
  if (t.device() != ctx.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is on ", t.device().ToString(),
                     ", the context on ", ctx.device().ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GatherRows(const ExecContext& ctx, const Tensor& src,
                        const Tensor& rows, Tensor* dst) {
  RETURN_IF_ERROR(OnDevice(ctx, "the gathered tensor", src));
  RETURN_IF_ERROR(OnDevice(ctx, "the row indices", rows));
  RETURN_IF_ERROR(OnDevice(ctx, "the gather's output", *dst));
  const bool cast =
      src.dtype() == DType::kFloat32 && dst->dtype() == DType::kBFloat16;
  if (src.ndim() < 1 || dst->ndim() < 1 || rows.dtype() != DType::kInt64 ||
      rows.ndim() != 1 || rows.dim(0) != dst->dim(0) ||
      (src.dtype() != dst->dtype() && !cast) ||
      (src.dim(0) > 0 ? src.numel() / src.dim(0) : 0) !=
          (dst->dim(0) > 0 ? dst->numel() / dst->dim(0) : 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gather of ", DTypeName(rows.dtype()), ShapeToString(rows.shape()),
        " rows of ", DTypeName(src.dtype()), ShapeToString(src.shape()),
        " into ", DTypeName(dst->dtype()), ShapeToString(dst->shape())));
  }
  const int64_t n = dst->dim(0);
  const int64_t cols = n > 0 ? dst->numel() / n : 0;
  if (ctx.device().is_cuda()) {
    return gpu::GatherRows(src.dtype(), dst->dtype(), n, cols, src.ptr(),
                           static_cast<const int64_t*>(rows.ptr()), dst->ptr(),
                           ctx.stream());
  }
  // The host and the simulated device: the same loop on host memory.
  const int64_t* r = static_cast<const int64_t*>(rows.ptr());
  if (cast) {
    const float* s = static_cast<const float*>(src.ptr());
    uint16_t* d = static_cast<uint16_t*>(dst->ptr());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t c = 0; c < cols; ++c) {
        d[i * cols + c] = FloatToBf16(s[r[i] * cols + c]);
      }
    }
    return absl::OkStatus();
  }
  const size_t row_bytes = cols * DTypeSize(src.dtype());
  const char* s = static_cast<const char*>(src.ptr());
  char* d = static_cast<char*>(dst->ptr());
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(d + i * row_bytes, s + r[i] * row_bytes, row_bytes);
  }
  return absl::OkStatus();
}

absl::Status FindNonFinite(const ExecContext& ctx, const Tensor& t,
                           double* slot) {
  RETURN_IF_ERROR(OnDevice(ctx, "the tensor checked", t));
  if (t.dtype() != DType::kFloat32 && t.dtype() != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("finiteness check of a ", DTypeName(t.dtype()),
                     " tensor: float32 or bfloat16 only"));
  }
  if (ctx.device().is_cuda()) {
    return gpu::FindNonFinite(t.dtype(), t.numel(), t.ptr(), slot,
                              ctx.stream());
  }
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = t.dtype() == DType::kFloat32
                        ? static_cast<const float*>(t.ptr())[i]
                        : Bf16ToFloat(static_cast<const uint16_t*>(t.ptr())[i]);
    if (!std::isfinite(v)) {
      const uint64_t word =
          std::numeric_limits<uint64_t>::max() - static_cast<uint64_t>(i);
      const double value = v;
      std::memcpy(slot, &word, sizeof(word));
      std::memcpy(slot + 1, &value, sizeof(value));
      break;
    }
  }
  return absl::OkStatus();
}

NonFinite DecodeNonFinite(const double* host_slot) {
  NonFinite r;
  uint64_t word;
  std::memcpy(&word, host_slot, sizeof(word));
  if (word == 0) return r;
  r.found = true;
  r.index = static_cast<int64_t>(std::numeric_limits<uint64_t>::max() - word);
  r.value = host_slot[1];
  return r;
}

absl::Status DeviceTotals(const ExecContext& ctx,
                          const DeviceTotalsArgs& args) {
  if (ctx.device().is_cuda()) return gpu::DeviceTotals(args, ctx.stream());
  ComputeDeviceTotals(args);  // host memory (CPU or simulated device)
  return absl::OkStatus();
}

}  // namespace trainyard
