// The simulated device's memory ("sim:N", core/device.h): host memory that
// the rest of the engine must treat as device memory. A tensor on sim:N
// fails every host access (`Tensor::data`, `raw_data`, ...) like a CUDA
// tensor; it is filled, read and computed on only through its ExecContext
// (kernels/exec_context.h), whose copies and synchronisations are counted.
//
// SimDeviceAccess is for the simulated device's own kernels — the CPU code
// that stands in for a GPU kernel (block forward and backward, casts, the
// optimizer update, a loss plugin's device half): they reach the memory
// through host views of it. Nothing else may call it; code that does is the
// bug the simulated device exists to find.
//
// Thread safety: everything here is thread-safe.
#ifndef TRAINYARD_CORE_SIM_DEVICE_H_
#define TRAINYARD_CORE_SIM_DEVICE_H_

#include "core/allocator.h"
#include "core/tensor.h"

namespace trainyard {

// The allocator of sim:N (N >= 0): HostAllocator's memory labelled sim:N,
// for the life of the process.
Allocator* SimAllocator(int index);

class SimDeviceAccess {
 public:
  // `t` (on a sim device) as a host tensor over the same memory.
  static Tensor HostView(const Tensor& t);
  // A host tensor's memory, without a copy, as a tensor on `device` (a sim
  // device): what a simulated kernel returns as its device output.
  static Tensor Adopt(const Tensor& host, Device device);
};

}  // namespace trainyard

#endif  // TRAINYARD_CORE_SIM_DEVICE_H_
