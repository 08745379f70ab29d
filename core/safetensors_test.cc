#include "core/safetensors.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return JoinPath(dir != nullptr ? dir : "/tmp", name);
}

// Builds a file from a header JSON text and raw data.
std::string Raw(const std::string& header, const std::string& data) {
  std::string out;
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
  return out + header + data;
}

SafetensorsFile Sample() {
  SafetensorsFile f;
  f.tensors.emplace_back("blocks.0.fc1.weight",
                         Tensor::FromVector({1, 2, 3, 4, 5, 6}, {2, 3}));
  Tensor bf = Tensor::Empty(DType::kBFloat16, {3});
  uint16_t* b = bf.data<uint16_t>();
  b[0] = 0x3F80;  // 1.0
  b[1] = 0xC000;  // -2.0
  b[2] = 0x0000;
  f.tensors.emplace_back("a_bf16", bf);
  Tensor i32 = Tensor::Empty(DType::kInt32, {2});
  i32.data<int32_t>()[0] = -7;
  i32.data<int32_t>()[1] = 1 << 30;
  f.tensors.emplace_back("i32", i32);
  Tensor i64 = Tensor::Empty(DType::kInt64, {});
  i64.data<int64_t>()[0] = -(int64_t{1} << 50);
  f.tensors.emplace_back("scalar_i64", i64);
  Tensor u8 = Tensor::Empty(DType::kUInt8, {5});
  for (int i = 0; i < 5; ++i)
    u8.data<uint8_t>()[i] = static_cast<uint8_t>(250 + i);
  f.tensors.emplace_back("task.state", u8);
  f.tensors.emplace_back("empty", Tensor::Empty(DType::kFloat32, {0, 4}));
  f.metadata["step"] = "12";
  f.metadata["rng"] = "{\"quoted\": \"\\n\"}";
  return f;
}

void ExpectSame(const SafetensorsFile& a, const SafetensorsFile& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    SCOPED_TRACE(a.tensors[i].first);
    EXPECT_EQ(a.tensors[i].first, b.tensors[i].first);
    const Tensor& x = a.tensors[i].second;
    const Tensor& y = b.tensors[i].second;
    EXPECT_EQ(x.dtype(), y.dtype());
    EXPECT_EQ(x.shape(), y.shape());
    ASSERT_EQ(x.nbytes(), y.nbytes());
    if (x.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0);
    }
  }
  EXPECT_EQ(a.metadata, b.metadata);
}

TEST(SafetensorsTest, RoundTripKeepsOrderValuesAndMetadata) {
  SafetensorsFile f = Sample();
  std::string path = TmpPath("rt.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, f).ok());
  auto back = ReadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(f, *back);
}

TEST(SafetensorsTest, HeaderIsPaddedToEightBytes) {
  std::string bytes = SerializeSafetensors(Sample());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
}

TEST(SafetensorsTest, GetFindsByNameOrSaysNotFound) {
  SafetensorsFile f = Sample();
  auto t = f.Get("i32");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->data<int32_t>()[0], -7);
  auto missing = f.Get("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("\"nope\""));
}

TEST(SafetensorsTest, ReadsTensorsInOffsetOrderWhateverTheJsonOrder) {
  std::string header =
      "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
      "\"__metadata__\":{\"k\":\"v\"}}";
  float v[2] = {1.f, 2.f};
  auto f = ParseSafetensors(
      Raw(header, std::string(reinterpret_cast<char*>(v), 8)), "mem");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->tensors.size(), 2u);
  EXPECT_EQ(f->tensors[0].first, "a");
  EXPECT_EQ(f->tensors[0].second.data<float>()[0], 1.f);
  EXPECT_EQ(f->tensors[1].first, "b");
  EXPECT_EQ(f->metadata.at("k"), "v");
}

struct BadCase {
  std::string label;
  std::string bytes;
  std::string expect;  // substring of the message
};

TEST(SafetensorsTest, RejectsInvalidFilesNamingFileAndTensor) {
  const std::string d8(8, '\0');
  const std::string ok_a =
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
  std::vector<BadCase> cases = {
      {"too short", "abc", "too short"},
      {"huge header", std::string("\xff\xff\xff\xff\xff\xff\x00\x00", 8) + "{}",
       "100 MiB"},
      {"header past end", Raw("{}", "").substr(0, 8) + "{", "truncated"},
      {"not json", Raw("{nope", d8), "not valid JSON"},
      {"not object", Raw("[1,2]", ""), "not an object"},
      {"unknown dtype",
       Raw("{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,8]}"
           "}",
           d8),
       "tensor \"a\": dtype F8_E4M3 is not supported"},
      {"size mismatch",
       Raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
           d8),
       "tensor \"a\": data_offsets [0, 8] span 8 bytes but shape [3] of F32 "
       "needs 12"},
      {"negative dim",
       Raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}",
           d8),
       "tensor \"a\": shape entries must be non-negative"},
      {"missing offsets", Raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", d8),
       "tensor \"a\": \"data_offsets\""},
      {"reversed offsets",
       Raw("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,0]}}",
           d8),
       "end before they begin"},
      {"gap",
       Raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
           d8),
       "tensor \"a\": data_offsets begin at 4, expected 0 (gap"},
      {"overlap",
       Raw("{" + ok_a +
               ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}"
               "}",
           d8),
       "overlaps"},
      {"past end",
       Raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
           d8),
       "tensor \"a\": truncated: data_offsets end at 16 but the data section "
       "has only 8 bytes"},
      {"trailing", Raw("{" + ok_a + "}", d8 + "xx"), "trailing bytes"},
      {"duplicate", Raw("{" + ok_a + "," + ok_a + "}", d8),
       "header names \"a\" twice"},
      {"metadata not strings", Raw("{\"__metadata__\":{\"k\":1}}", ""),
       "__metadata__ value \"k\" is not a string"},
  };
  for (const BadCase& c : cases) {
    std::string path = TmpPath("bad.safetensors");
    ASSERT_TRUE(WriteFileAtomically(path, c.bytes).ok());
    auto f = ReadSafetensors(path);
    ASSERT_FALSE(f.ok()) << c.label;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << c.label;
    EXPECT_THAT(f.status().message(), HasSubstr(path)) << c.label;
    EXPECT_THAT(f.status().message(), HasSubstr(c.expect)) << c.label;
  }
}

TEST(SafetensorsTest, ErrorsDoNotGiveAwayTheBytesOfAFileThatIsNotOne) {
  // What /etc/passwd starts with: its first 8 bytes read as a length.
  const std::string passwd = "root:x:0:0:root:/root:/bin/bash\n";
  auto parsed = ParseSafetensors(passwd, "init.safetensors");
  ASSERT_FALSE(parsed.ok());
  const std::string msg(parsed.status().message());
  EXPECT_THAT(msg, HasSubstr("exceeds the 100 MiB limit"));
  uint64_t as_length = 0;
  for (int i = 7; i >= 0; --i) {
    as_length = (as_length << 8) | static_cast<unsigned char>(passwd[i]);
  }
  EXPECT_EQ(msg.find(absl::StrCat(as_length)), std::string::npos) << msg;
  EXPECT_EQ(msg.find("root"), std::string::npos) << msg;
  // A length under the limit but past the end is not quoted either.
  std::string short_file(8, '\0');
  short_file[0] = '\x39';
  short_file[1] = '\x30';  // 12345
  parsed = ParseSafetensors(short_file + "abc", "x.safetensors");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(std::string(parsed.status().message()).find("12345"),
            std::string::npos);
}

TEST(SafetensorsTest, TruncatedWrittenFileIsCaught) {
  std::string bytes = SerializeSafetensors(Sample());
  for (size_t cut : {bytes.size() - 1, bytes.size() / 2, size_t{20}}) {
    auto f = ParseSafetensors(bytes.substr(0, cut), "cut.safetensors");
    ASSERT_FALSE(f.ok()) << cut;
    EXPECT_THAT(f.status().message(), HasSubstr("cut.safetensors")) << cut;
  }
}

TEST(SafetensorsTest, WriteRejectsDuplicateAndReservedNames) {
  SafetensorsFile f;
  f.tensors.emplace_back("x", Tensor::FromVector({1}, {1}));
  f.tensors.emplace_back("x", Tensor::FromVector({2}, {1}));
  std::string path = TmpPath("dup.safetensors");
  absl::Status s = WriteSafetensors(path, f);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("tensor \"x\" appears twice"));
  SafetensorsFile g;
  g.tensors.emplace_back("__metadata__", Tensor::FromVector({1}, {1}));
  EXPECT_FALSE(WriteSafetensors(path, g).ok());
  EXPECT_EQ(FileSize(path).status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, FailedWriteLeavesExistingFile) {
  std::string path = TmpPath("keep.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, Sample()).ok());
  SafetensorsFile dup;
  dup.tensors.emplace_back("x", Tensor::FromVector({1}, {1}));
  dup.tensors.emplace_back("x", Tensor::FromVector({1}, {1}));
  ASSERT_FALSE(WriteSafetensors(path, dup).ok());
  auto back = ReadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(Sample(), *back);
}

TEST(SafetensorsTest, EmptyFileHasNoTensors) {
  auto f = ParseSafetensors(SerializeSafetensors(SafetensorsFile{}), "e");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->tensors.empty());
  EXPECT_TRUE(f->metadata.empty());
}

}  // namespace
}  // namespace trainyard
