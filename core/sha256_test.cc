#include "core/sha256.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

// FIPS 180-2 test vectors.
TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256Test, FileMatchesInMemoryAcrossBufferBoundary) {
  std::string data(3 * (1 << 20) + 17, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string path = std::string(tmp ? tmp : "/tmp") + "/sha_input";
  std::ofstream(path, std::ios::binary) << data;
  auto got = Sha256HexOfFile(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, Sha256Hex(data));
  EXPECT_NE(*got, Sha256Hex(data.substr(1)));
}

TEST(Sha256Test, MissingFileNamesPath) {
  auto got = Sha256HexOfFile("/nonexistent/x.bin");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(),
              ::testing::HasSubstr("/nonexistent/x.bin"));
}

std::string Hex(const std::string& bytes) {
  return absl::BytesToHexString(bytes);
}

// RFC 4231 section 4, HMAC-SHA-256 (test case 5's tag is truncated to 128
// bits there).
TEST(HmacSha256Test, Rfc4231Vectors) {
  struct Case {
    std::string key, data, tag;
  };
  const std::string aa131(131, '\xaa');
  const Case cases[] = {
      {std::string(20, '\x0b'), "Hi There",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {std::string(20, '\xaa'), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {absl::HexStringToBytes(
           "0102030405060708090a0b0c0d0e0f10111213141516171819"),
       std::string(50, '\xcd'),
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {std::string(20, '\x0c'), "Test With Truncation",
       "a3b6167473100ee06e0c796c2955552b"},
      {aa131, "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {aa131,
       "This is a test using a larger than block-size key and a larger than "
       "block-size data. The key needs to be hashed before being used by the "
       "HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (const Case& c : cases) {
    const std::string tag = HmacSha256(c.key, c.data);
    ASSERT_EQ(tag.size(), kHmacSha256Size);
    EXPECT_EQ(Hex(tag).substr(0, c.tag.size()), c.tag) << c.data;
  }
}

// RFC 2104 pads the key with zeros to the block size, so an empty key is
// the same as one zero byte; the handshake relies on empty keys working.
TEST(HmacSha256Test, EmptyKeyAndEmptyData) {
  EXPECT_EQ(HmacSha256("", "abc"), HmacSha256(std::string(1, '\0'), "abc"));
  EXPECT_EQ(Hex(HmacSha256("", "")),
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
  EXPECT_NE(HmacSha256("k", "abc"), HmacSha256("", "abc"));
}

TEST(RandomBytesTest, LengthAndTwoCallsDiffer) {
  EXPECT_EQ(RandomBytes(0), "");
  const std::string a = RandomBytes(32), b = RandomBytes(32);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(b.size(), 32u);
  EXPECT_NE(a, b);  // 2^-256 to fail by chance
  EXPECT_EQ(RandomBytes(1000).size(), 1000u);
}

}  // namespace
}  // namespace trainyard
