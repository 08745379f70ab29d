// Device: where a tensor's bytes live and a stage's kernels run — the host
// ("cpu") or one CUDA GPU ("cuda:N"). The one parser of device strings for
// the whole code base (flags, specs, worker registrations).
#ifndef TRAINYARD_CORE_DEVICE_H_
#define TRAINYARD_CORE_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

struct Device {
  enum class Kind : int32_t { kCpu = 0, kCuda = 1 };
  Kind kind = Kind::kCpu;
  int32_t index = 0;  // the GPU's ordinal; 0 for the host

  static Device Cpu() { return Device{}; }
  static Device Cuda(int32_t index) { return Device{Kind::kCuda, index}; }
  bool is_cpu() const { return kind == Kind::kCpu; }
  bool is_cuda() const { return kind == Kind::kCuda; }
  std::string ToString() const;  // "cpu" or "cuda:N"
  // "cpu" or "cuda": what the scheduler matches jobs and workers by.
  const char* KindName() const { return is_cpu() ? "cpu" : "cuda"; }
  bool operator==(const Device& o) const {
    return kind == o.kind && index == o.index;
  }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// Parses "cpu" or "cuda:N" (N a decimal in [0, 1023]). A bare "cuda" is an
// error unless `allow_bare_cuda`, when it means cuda:0. Errors are
// InvalidArgument quoting the text and saying what is expected.
absl::StatusOr<Device> ParseDevice(absl::string_view text,
                                   bool allow_bare_cuda = false);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_DEVICE_H_
