#include "core/sha256.h"

#include <cstdlib>
#include <fstream>
#include <string>

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

}  // namespace
}  // namespace trainyard
