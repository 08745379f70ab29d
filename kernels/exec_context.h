// ExecContext: where one pipeline stage computes — its device, the stream
// its kernels are ordered on, the allocator its tensors come from, and the
// precision of its activations and GEMMs. Blocks, the optimizer and the
// loss head take one; the engine's code is the same for every device.
//
// CPU: host memory (64-byte aligned), no stream, fp32 only (Cast widens
// float16 and bfloat16 data to float32).
// CUDA (cuda:N): device memory from the process-wide caching allocator of
// GPU N (kernels/cuda/device_allocator.h) and one non-blocking stream per
// GPU and process (it never waits for the legacy default stream). Every
// context of one GPU in a process shares that stream, so the caching
// allocator's immediate reuse of freed blocks is safe (all work is ordered
// on one stream) and stages that share a GPU hand tensors to each other
// without copies or events: a tensor's consumer is queued after its
// producer. Communication libraries keep their own streams and order them
// against it with events (transport/nccl_transport.h: SetComputeStream).
// Simulated (sim:N, core/sim_device.h): memory the engine must treat as
// device memory, computed on by the CPU's kernels as work is queued (so
// nothing is ever pending); fp32, or bf16 activations that its kernels
// widen to float32 and round back. It runs what a GPU step runs, with the
// same copies and synchronisations, on a machine without a GPU.
//
// Traffic: on a device context (CUDA or simulated) every host<->device copy
// made through the context and every synchronisation is counted
// (traffic()), which is how tests hold a step to its copy budget.
//
// Precision (JobSpec.precision): fp32 (float32 activations and GEMMs),
// tf32 (float32 tensors, TF32 tensor-core GEMMs; CUDA only), bf16 (bfloat16
// activations and GEMM inputs with float32 accumulation; CUDA, or simulated).
// Parameters, gradients and optimizer state are float32 on every device.
//
// Thread safety: const methods may be called from any thread; copies are
// ordered on the context's stream.
#ifndef TRAINYARD_KERNELS_EXEC_CONTEXT_H_
#define TRAINYARD_KERNELS_EXEC_CONTEXT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/tensor.h"
#include "kernels/device_traffic.h"

struct CUstream_st;  // cudaStream_t without CUDA headers

namespace trainyard {

enum class Precision { kFp32, kTf32, kBf16 };

// "fp32", "tf32", "bf16".
const char* PrecisionName(Precision precision);
absl::StatusOr<Precision> PrecisionFromName(absl::string_view name);

class ExecContext {
 public:
  // Errors: FailedPrecondition when `device` is a GPU that does not exist
  // or this build has no CUDA (the reason says which); InvalidArgument for
  // tf32/bf16 on the CPU and tf32 on the simulated device.
  static absl::StatusOr<std::unique_ptr<ExecContext>> Create(
      Device device, Precision precision);

  const Device& device() const { return device_; }
  Precision precision() const { return precision_; }
  // bfloat16 for bf16, else float32.
  DType activation_dtype() const {
    return precision_ == Precision::kBf16 ? DType::kBFloat16 : DType::kFloat32;
  }
  // The GPU's compute stream (see the file comment); null on the CPU and
  // the simulated device.
  CUstream_st* stream() const { return stream_; }
  Allocator* allocator() const { return allocator_; }
  // "cpu fp32", "cuda:0 bf16".
  std::string ToString() const;

  // Uninitialised / zeroed memory on this context's device.
  absl::StatusOr<Tensor> Empty(DType dtype, Shape shape) const;
  absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape) const;
  // Sets every byte of *t (on this context's device) to zero (queued).
  absl::Status SetZero(Tensor* t) const;

  // `t` on the host: as it is when it is already there, else a copy made
  // after the work queued on the stream (the call waits for it).
  absl::StatusOr<Tensor> ToHost(const Tensor& t) const;
  // A new host tensor holding a copy of `t` (from any device; on the host
  // too), after the work queued on the stream.
  absl::StatusOr<Tensor> HostCopy(const Tensor& t) const;
  // `t` on this context's device: as it is when it is already there, else
  // a copy (the host tensor may be released when this returns).
  absl::StatusOr<Tensor> ToDevice(const Tensor& t) const;
  // `t` converted to `dtype` on `t`'s device, which must be this context's
  // (the same dtype: `t` itself). The conversions are CastInto's.
  absl::StatusOr<Tensor> Cast(const Tensor& t, DType dtype) const;
  // Writes src converted to dst's dtype into *dst (same element count, both
  // on this context's device), queued on the stream; no copy between host
  // and device, nothing counted in traffic(). The same dtype is a plain
  // copy; otherwise, with the same bits on the CPU, the simulated device
  // and CUDA (except float32 NaN payloads, see below):
  //   float32 -> bfloat16: round to nearest even, any NaN -> 0x7FFF
  //     (core/bfloat16.h FloatToBf16); not on the CPU, which computes in
  //     float32 only;
  //   bfloat16 -> float32: exact;
  //   float16 -> float32: exact (core/npy.h Float16ToFloat); a NaN stays
  //     NaN, with its payload on the host, as 0x7FFFFFFF on CUDA;
  //   float16 -> bfloat16: FloatToBf16 of the exact float32 value, so
  //     widening on the device gives what widening on the host and then
  //     casting gives.
  // Errors: InvalidArgument naming both dtypes for any other pair, naming
  // the devices for a tensor on another device, naming the shapes for
  // different element counts.
  absl::Status CastInto(const Tensor& src, Tensor* dst) const;
  // Copies src into *dst (same dtype and element count; any devices). A
  // copy between host and device waits for it (counted as a
  // synchronisation); see the Async variants for the step's copies.
  absl::Status CopyInto(const Tensor& src, Tensor* dst) const;

  // Host memory the device's copy engines read and write directly
  // (page-locked on CUDA, plain host memory elsewhere): what the
  // asynchronous copies below take on the host side.
  absl::StatusOr<Tensor> PinnedEmpty(DType dtype, Shape shape) const;
  // Queues a copy of host `src` (from PinnedEmpty) into device `*dst` (same
  // dtype and element count) and returns: `src` must stay unchanged until
  // the stream has passed the copy (after the next Synchronize, say).
  // Counted as a copy, not a synchronisation.
  absl::Status CopyToDeviceAsync(const Tensor& src, Tensor* dst) const;
  // Queues a copy of device `src` into host `*dst` (from PinnedEmpty) and
  // returns: read `dst` only after Synchronize(). Counted as a copy.
  absl::Status CopyToHostAsync(const Tensor& src, Tensor* dst) const;
  // *dst += src, element by element (float32, same element count, both on
  // this context's device): each element is one float add, so the result
  // is the same bits on the CPU and on any GPU.
  absl::Status AddInto(const Tensor& src, Tensor* dst) const;
  // Bytes of free memory on the device: the GPU's; unbounded (INT64_MAX)
  // on the simulated device and the host.
  absl::StatusOr<int64_t> FreeMemoryBytes() const;
  // Waits for the work queued on the stream (counted in traffic()).
  absl::Status Synchronize() const;
  // What this context has copied and waited for so far.
  DeviceTraffic traffic() const;
  // Makes this context's GPU current for the calling thread (CUDA calls
  // act on the thread's current device); a no-op on the CPU. Call it first
  // on every thread that uses the context.
  absl::Status Activate() const;

 private:
  ExecContext(Device d, Precision p, Allocator* a, CUstream_st* stream)
      : device_(d), precision_(p), allocator_(a), stream_(stream) {}
  // Counts a copy of `bytes` between the host and this context's device,
  // and a synchronisation when the copy waits for the device.
  void CountCopy(bool to_device, size_t bytes, bool waits) const;
  // CopyToDeviceAsync (to_device) or CopyToHostAsync, checked and counted.
  absl::Status CopyAsync(bool to_device, const Tensor& src, Tensor* dst) const;

  Device device_;
  Precision precision_;
  Allocator* allocator_;
  CUstream_st* stream_ = nullptr;
  mutable std::atomic<int64_t> h2d_copies_{0}, h2d_bytes_{0}, d2h_copies_{0},
      d2h_bytes_{0}, syncs_{0};
};

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_EXEC_CONTEXT_H_
