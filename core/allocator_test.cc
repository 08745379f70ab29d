#include "core/allocator.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// Whether this kernel has transparent huge pages at all (built in; the
// mode may still be "never", which keeps the flag but gives no pages) and
// shows mappings' flags (some sandboxes' /proc does not).
bool KernelHasHugePages() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  if (!f.good()) return false;
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  while (std::getline(smaps, line)) {
    if (line.rfind("VmFlags:", 0) == 0) return true;
  }
  return false;
}

// The VmFlags of the mapping holding `p`, from /proc/self/smaps ("" when
// not found).
std::string VmFlagsAt(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    // A mapping's first line: "start-end perms offset dev inode [path]".
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    uint64_t start = 0, end = 0;
    if (dash != std::string::npos && space != std::string::npos &&
        dash < space && absl::SimpleHexAtoi(line.substr(0, dash), &start) &&
        absl::SimpleHexAtoi(line.substr(dash + 1, space - dash - 1), &end)) {
      inside = start <= Address(p) && Address(p) < end;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

bool AskedForHugePages(const void* p) {
  const std::string flags = VmFlagsAt(p);
  EXPECT_FALSE(flags.empty()) << "no mapping holds " << p;
  for (absl::string_view flag : absl::StrSplit(flags, ' ')) {
    if (flag == "hg") return true;
  }
  return false;
}

TEST(AllocateHostBlockTest, SmallBlocksAre64ByteAligned) {
  for (size_t bytes : {size_t{1}, size_t{100}, size_t{4096}, kMiB + 3}) {
    void* p = AllocateHostBlock(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(Address(p) % 64, 0u) << bytes;
    std::memset(p, 0xab, bytes);
    std::free(p);
  }
}

TEST(AllocateHostBlockTest, LargeBlocksStartOnA2MiBBoundary) {
  for (size_t bytes : {2 * kMiB, 5 * kMiB + 12, 16 * kMiB}) {
    void* p = AllocateHostBlock(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(Address(p) % (2 * kMiB), 0u) << bytes;
    std::memset(p, 0xab, bytes);
    std::free(p);
  }
}

TEST(AllocateHostBlockTest, LargeBlocksAskForHugePagesUnlessTurnedOff) {
  if (!KernelHasHugePages()) {
    GTEST_SKIP() << "no transparent huge pages or no VmFlags in smaps";
  }
  SetHostHugePagesForTesting(true);
  void* huge = AllocateHostBlock(8 * kMiB);
  ASSERT_NE(huge, nullptr);
  EXPECT_TRUE(AskedForHugePages(huge)) << VmFlagsAt(huge);
  // The last whole 2 MiB page too; below 2 MiB nothing is asked.
  EXPECT_TRUE(AskedForHugePages(static_cast<char*>(huge) + 8 * kMiB - 1));
  void* small = AllocateHostBlock(kMiB);
  ASSERT_NE(small, nullptr);

  SetHostHugePagesForTesting(false);
  void* plain = AllocateHostBlock(8 * kMiB);
  ASSERT_NE(plain, nullptr);
  EXPECT_FALSE(AskedForHugePages(plain)) << VmFlagsAt(plain);
  SetHostHugePagesForTesting(true);
  std::free(huge);
  std::free(small);
  std::free(plain);
}

TEST(HostAllocatorTest, LargeTensorsGetHugePageBlocks) {
  if (!KernelHasHugePages()) {
    GTEST_SKIP() << "no transparent huge pages or no VmFlags in smaps";
  }
  SetHostHugePagesForTesting(true);
  Allocator* host = HostAllocator();
  auto p = host->Allocate(16 * kMiB + 100);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Address(*p) % (2 * kMiB), 0u);
  EXPECT_TRUE(AskedForHugePages(*p)) << VmFlagsAt(*p);
  host->Deallocate(*p);
  // A cached block comes back as it was.
  auto again = host->Allocate(16 * kMiB + 100);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *p);
  host->Deallocate(*again);
  host->EmptyCache();
}

TEST(HostAllocatorTest, RefusesImpossibleSizesWithAnError) {
  auto p = HostAllocator()->Allocate(~size_t{0} - 10);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("out of host memory"), std::string::npos)
      << p.status();
}

}  // namespace
}  // namespace trainyard
