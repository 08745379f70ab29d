// Device: where a tensor's bytes live and a stage's kernels run — the host
// ("cpu"), one CUDA GPU ("cuda:N"), or a simulated device ("sim:N"). The one
// parser of device strings for the whole code base (flags, specs, worker
// registrations).
//
// The simulated device (kernels/sim_device.h) runs the CPU's kernels on
// memory that the engine must treat as device memory: host access is a bug
// there as on CUDA, and every host<->device copy and synchronisation is
// counted. It exists to test a GPU step's data flow on machines without a
// GPU; it is never faster than "cpu".
#ifndef TRAINYARD_CORE_DEVICE_H_
#define TRAINYARD_CORE_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

struct Device {
  enum class Kind : int32_t { kCpu = 0, kCuda = 1, kSim = 2 };
  Kind kind = Kind::kCpu;
  int32_t index = 0;  // the GPU's ordinal; 0 for the host

  static Device Cpu() { return Device{}; }
  static Device Cuda(int32_t index) { return Device{Kind::kCuda, index}; }
  static Device Sim(int32_t index) { return Device{Kind::kSim, index}; }
  bool is_cpu() const { return kind == Kind::kCpu; }
  bool is_cuda() const { return kind == Kind::kCuda; }
  bool is_sim() const { return kind == Kind::kSim; }
  std::string ToString() const;  // "cpu", "cuda:N" or "sim:N"
  // "cpu", "cuda" or "sim": what the scheduler matches jobs and workers by.
  const char* KindName() const;
  bool operator==(const Device& o) const {
    return kind == o.kind && index == o.index;
  }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// Parses "cpu", "cuda:N" or "sim:N" (N a decimal in [0, 1023]). A bare
// "cuda" is an error unless `allow_bare_cuda`, when it means cuda:0 (and a
// bare "sim" sim:0). Errors are InvalidArgument quoting the text and saying
// what is expected.
absl::StatusOr<Device> ParseDevice(absl::string_view text,
                                   bool allow_bare_cuda = false);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_DEVICE_H_
