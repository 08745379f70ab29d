#include "core/host_info.h"

#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

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

absl::StatusOr<uint64_t> ProcessStatusBytes(absl::string_view field) {
  std::ifstream in("/proc/self/status");
  const std::string prefix = absl::StrCat(field, ":");
  for (std::string line; std::getline(in, line);) {
    if (!absl::StartsWith(line, prefix)) continue;
    absl::string_view value = absl::StripAsciiWhitespace(
        absl::string_view(line).substr(prefix.size()));
    uint64_t kib = 0;
    if (!absl::ConsumeSuffix(&value, "kB") ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(value), &kib)) {
      return absl::InternalError(
          absl::StrCat("/proc/self/status: ", field, " is not a count of kB"));
    }
    return kib * 1024;
  }
  return absl::NotFoundError(
      absl::StrCat("/proc/self/status: no ", field, " line"));
}

}  // namespace trainyard
