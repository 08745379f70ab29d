#include "core/crc32c.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(Crc32cTest, KnownVectors) {
  // RFC 3720 B.4 and the classic check value.
  EXPECT_EQ(Crc32cExtend(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cExtendPortable(0, "123456789", 9), 0xE3069283u);
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32cExtend(0, zeros.data(), 32), 0x8A9136AAu);
  std::string ones(32, '\xff');
  EXPECT_EQ(Crc32cExtendPortable(0, ones.data(), 32), 0x62A8AB43u);
}

TEST(Crc32cTest, HardwareMatchesTableOnOddLengthsAndOffsets) {
  std::string data(100007, '\0');
  uint64_t x = 12345;
  for (char& c : data) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    c = static_cast<char>(x >> 56);
  }
  for (size_t off : {0, 1, 3, 7}) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 4096, 24575, 24576, 24583, 100000}) {
      EXPECT_EQ(Crc32cExtend(0, data.data() + off, n),
                Crc32cExtendPortable(0, data.data() + off, n))
          << off << " " << n;
    }
  }
  // Extending in pieces equals one pass.
  const uint32_t whole = Crc32cExtend(0, data.data(), data.size());
  uint32_t pieces = Crc32cExtend(0, data.data(), 1234);
  pieces = Crc32cExtend(pieces, data.data() + 1234, data.size() - 1234);
  EXPECT_EQ(whole, pieces);
}

}  // namespace
}  // namespace trainyard
