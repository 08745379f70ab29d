// Facts about the machine a process runs on.
#ifndef TRAINYARD_CORE_HOST_INFO_H_
#define TRAINYARD_CORE_HOST_INFO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// gethostname(), or "localhost" when it fails.
std::string Hostname();

// Physical memory in bytes; 0 when the system does not say.
uint64_t PhysicalMemoryBytes();

// Physical memory, or the cgroup's memory limit when that is lower (a pod).
uint64_t UsableMemoryBytes();

// A "<n> kB" field of this process's /proc/self/status ("VmRSS", "VmHWM"),
// in bytes. NotFound when there is no such line; Internal when its value is
// not a count of kB.
absl::StatusOr<uint64_t> ProcessStatusBytes(absl::string_view field);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_HOST_INFO_H_
