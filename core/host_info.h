// Facts about the machine a process runs on.
#ifndef TRAINYARD_CORE_HOST_INFO_H_
#define TRAINYARD_CORE_HOST_INFO_H_

#include <cstdint>
#include <string>

namespace trainyard {

// gethostname(), or "localhost" when it fails.
std::string Hostname();

// Physical memory in bytes; 0 when the system does not say.
uint64_t PhysicalMemoryBytes();

// Physical memory, or the cgroup's memory limit when that is lower (a pod).
uint64_t UsableMemoryBytes();

}  // namespace trainyard

#endif  // TRAINYARD_CORE_HOST_INFO_H_
