#include "kernels/cpu_kind.h"

#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

// The first processor's entry of /proc/cpuinfo: the kernel's own reading
// of CPUID, a source independent of the compiler's builtins.
struct CpuInfo {
  bool ok = false;
  std::string vendor;
  int family = -1;
  std::set<std::string> flags;
};

CpuInfo ReadCpuInfo() {
  CpuInfo info;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) {
      if (info.ok) break;  // the end of the first processor's entry
      continue;
    }
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value =
        colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "vendor_id") info.vendor = value;
    if (key == "cpu family") info.family = std::stoi(value);
    if (key == "flags") {
      std::istringstream words(value);
      for (std::string w; words >> w;) info.flags.insert(w);
      info.ok = true;
    }
  }
  return info;
}

TEST(CpuKindTest, AgreesWithTheKernelsCpuinfo) {
  const CpuInfo info = ReadCpuInfo();
  if (!info.ok) GTEST_SKIP() << "no readable /proc/cpuinfo with flags";
  const auto has = [&](const char* flag) { return info.flags.count(flag) > 0; };
  std::cout << "vendor " << info.vendor << ", family " << info.family
            << ": avx2+fma " << CpuHasAvx2Fma() << ", avx512 " << CpuHasAvx512()
            << ", half-width avx512 " << CpuHasHalfWidthAvx512() << std::endl;
  EXPECT_EQ(CpuHasAvx2Fma(), has("avx2") && has("fma"));
  const bool avx512 =
      has("avx512f") && has("avx512bw") && has("avx512dq") && has("avx512vl");
  EXPECT_EQ(CpuHasAvx512(), avx512);
  EXPECT_EQ(CpuHasHalfWidthAvx512(),
            avx512 && info.vendor == "AuthenticAMD" && info.family == 25);
}

TEST(CpuKindTest, HalfWidthAvx512IsAvx512) {
  if (CpuHasHalfWidthAvx512()) {
    EXPECT_TRUE(CpuHasAvx512());
  }
  if (CpuHasAvx512()) {
    EXPECT_TRUE(CpuHasAvx2Fma());
  }
}

}  // namespace
}  // namespace trainyard
