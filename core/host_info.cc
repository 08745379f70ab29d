#include "core/host_info.h"

#include <unistd.h>

#include <fstream>

namespace trainyard {

std::string Hostname() {
  char buf[256];
  if (gethostname(buf, sizeof(buf)) != 0) return "localhost";
  buf[sizeof(buf) - 1] = '\0';
  return buf;
}

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

uint64_t UsableMemoryBytes() {
  uint64_t usable = PhysicalMemoryBytes();
  for (const char* path : {"/sys/fs/cgroup/memory.max",
                           "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    unsigned long long limit = 0;
    if (in >> limit && limit > 0 && (usable == 0 || limit < usable)) {
      usable = static_cast<uint64_t>(limit);
    }
  }
  return usable;
}

}  // namespace trainyard
