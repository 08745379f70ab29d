#include "core/npy.h"

#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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

// Fixtures written by numpy itself (core/testdata/make_npy_fixtures.py).
std::string Fixture(const std::string& name) { return "core/testdata/" + name; }

// A .npy file by hand: magic, version, little-endian header length, header
// text (padded by the caller or not), data.
std::string HandMade(int major, const std::string& dict,
                     const std::string& data) {
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  const size_t n = dict.size();
  out.push_back(static_cast<char>(n & 0xFF));
  out.push_back(static_cast<char>((n >> 8) & 0xFF));
  if (major >= 2) {
    out.push_back(static_cast<char>((n >> 16) & 0xFF));
    out.push_back(static_cast<char>((n >> 24) & 0xFF));
  }
  return out + dict + data;
}

std::string WriteBytes(const std::string& name, const std::string& bytes) {
  std::string path = TmpPath(name);
  EXPECT_TRUE(WriteFileAtomically(path, bytes).ok());
  return path;
}

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

TEST(NpyTest, ReadsNumpyFloat32Matrix) {
  auto t = ReadNpy(Fixture("npy_f32_2x3.npy"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), DType::kFloat32);
  EXPECT_EQ(t->shape(), (Shape{2, 3}));
  std::vector<float> got(t->data<float>(), t->data<float>() + 6);
  EXPECT_EQ(got, (std::vector<float>{-0.5f, -0.25f, 0.f, 0.25f, 0.5f, 0.75f}));
}

TEST(NpyTest, ReadsNumpyInt64Vector) {
  auto t = ReadNpy(Fixture("npy_i64_1d.npy"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), DType::kInt64);
  EXPECT_EQ(t->shape(), (Shape{4}));
  const int64_t* p = t->data<int64_t>();
  EXPECT_EQ(p[0], -3);
  EXPECT_EQ(p[1], 0);
  EXPECT_EQ(p[2], 7);
  EXPECT_EQ(p[3], int64_t{1} << 40);
}

TEST(NpyTest, ReadsNumpyVersion2ZeroDimInt32) {
  auto header = ReadNpyHeader(Fixture("npy_i32_0d_v2.npy"));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->dtype, DType::kInt32);
  EXPECT_EQ(header->shape, Shape{});
  EXPECT_EQ(header->data_offset % 64, 0u);
  auto t = ReadNpy(Fixture("npy_i32_0d_v2.npy"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->numel(), 1);
  EXPECT_EQ(t->data<int32_t>()[0], -123456);
}

TEST(NpyTest, RejectsNumpyFortranOrder) {
  auto t = ReadNpy(Fixture("npy_f32_fortran.npy"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("npy_f32_fortran.npy"));
  EXPECT_THAT(t.status().message(), HasSubstr("fortran_order"));
}

TEST(NpyTest, WriteMatchesNumpyBytes) {
  Tensor t =
      Tensor::FromVector({-0.5f, -0.25f, 0.f, 0.25f, 0.5f, 0.75f}, {2, 3});
  std::string path = TmpPath("ours_2x3.npy");
  ASSERT_TRUE(WriteNpy(path, t).ok());
  auto ours = ReadFileToString(path);
  auto numpy = ReadFileToString(Fixture("npy_f32_2x3.npy"));
  ASSERT_TRUE(ours.ok() && numpy.ok());
  EXPECT_EQ(*ours, *numpy);
}

TEST(NpyTest, WriteMatchesNumpyBytesFor1D) {
  Tensor t = Tensor::Empty(DType::kInt64, {4});
  int64_t* p = t.data<int64_t>();
  p[0] = -3;
  p[1] = 0;
  p[2] = 7;
  p[3] = int64_t{1} << 40;
  std::string path = TmpPath("ours_1d.npy");
  ASSERT_TRUE(WriteNpy(path, t).ok());
  auto ours = ReadFileToString(path);
  auto numpy = ReadFileToString(Fixture("npy_i64_1d.npy"));
  ASSERT_TRUE(ours.ok() && numpy.ok());
  EXPECT_EQ(*ours, *numpy);
}

TEST(NpyTest, RoundTripsEveryDTypeAndRank) {
  Tensor i32 = Tensor::Empty(DType::kInt32, {3, 1, 2});
  for (int i = 0; i < 6; ++i) i32.data<int32_t>()[i] = i * 1000 - 2500;
  Tensor scalar = Tensor::FromVector({3.5f}, {});
  Tensor empty = Tensor::Empty(DType::kFloat32, {0, 4});
  for (const Tensor& t : {i32, scalar, empty}) {
    std::string path = TmpPath("rt.npy");
    ASSERT_TRUE(WriteNpy(path, t).ok());
    auto back = ReadNpy(path);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->dtype(), t.dtype());
    EXPECT_EQ(back->shape(), t.shape());
    ASSERT_EQ(back->nbytes(), t.nbytes());
    if (t.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(back->raw_data(), t.raw_data(), t.nbytes()), 0);
    }
  }
}

TEST(NpyTest, ReadsVersion3Header) {
  std::string path = WriteBytes(
      "v3.npy",
      HandMade(3, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n",
               FloatBytes({1.5f, -2.f})));
  auto t = ReadNpy(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape(), (Shape{2}));
  EXPECT_EQ(t->data<float>()[1], -2.f);
}

TEST(NpyTest, AcceptsKeysInAnyOrderAndNoTrailingComma) {
  std::string path = WriteBytes(
      "order.npy", HandMade(1,
                            "{\"shape\": (1, 2), \"fortran_order\": False, "
                            "\"descr\": \"<f4\"}",
                            FloatBytes({1.f, 2.f})));
  auto t = ReadNpy(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape(), (Shape{1, 2}));
}

TEST(NpyTest, WrongMagicNamesFile) {
  std::string path = WriteBytes("magic.npy", "PK\x03\x04 this is a zip");
  auto t = ReadNpy(path);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr(path));
  EXPECT_THAT(t.status().message(), HasSubstr("magic"));
  EXPECT_FALSE(ReadNpyHeader(path).ok());
}

TEST(NpyTest, UnsupportedVersion) {
  std::string path =
      WriteBytes("v9.npy", HandMade(9,
                                    "{'descr': '<f4', 'fortran_order': False, "
                                    "'shape': (), }",
                                    FloatBytes({1.f})));
  auto t = ReadNpy(path);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("version 9.0"));
}

NpyReadOptions Float16Allowed() {
  NpyReadOptions options;
  options.float16 = true;
  return options;
}

TEST(NpyTest, UnsupportedDTypeNamesIt) {
  std::string path =
      WriteBytes("f8.npy", HandMade(1,
                                    "{'descr': '<f8', 'fortran_order': False, "
                                    "'shape': (1,), }",
                                    std::string(8, '\0')));
  auto t = ReadNpy(path);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr(path));
  EXPECT_THAT(
      t.status().message(),
      HasSubstr("dtype '<f8' is not supported (expected <f4, <i4 or <i8)"));
  // With float16 allowed, the list says so.
  EXPECT_THAT(ReadNpyHeader(path, Float16Allowed()).status().message(),
              HasSubstr("(expected <f4, <f2, <i4 or <i8)"));
}

TEST(NpyTest, BigEndianIsUnsupported) {
  std::string path =
      WriteBytes("be.npy", HandMade(1,
                                    "{'descr': '>f4', 'fortran_order': False, "
                                    "'shape': (1,), }",
                                    std::string(4, '\0')));
  EXPECT_THAT(ReadNpy(path).status().message(), HasSubstr("'>f4'"));
}

TEST(NpyTest, TruncatedDataNamesSizes) {
  std::string path = WriteBytes(
      "short.npy", HandMade(1,
                            "{'descr': '<f4', 'fortran_order': False, "
                            "'shape': (4, 256), }",
                            std::string(100, '\0')));
  auto t = ReadNpy(path);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr(path));
  EXPECT_THAT(t.status().message(),
              HasSubstr("truncated: header promises 4096 bytes of data"));
  EXPECT_THAT(t.status().message(), HasSubstr("file has 100"));
  // The header-only check sees it too.
  EXPECT_THAT(ReadNpyHeader(path).status().message(), HasSubstr("truncated"));
}

TEST(NpyTest, TruncatedHeader) {
  std::string full = HandMade(1,
                              "{'descr': '<f4', 'fortran_order': False, "
                              "'shape': (1,), }",
                              FloatBytes({1.f}));
  std::string path = WriteBytes("short_header.npy", full.substr(0, 30));
  auto t = ReadNpy(path);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("truncated"));
  EXPECT_THAT(ReadNpyHeader(path).status().message(), HasSubstr("truncated"));
  std::string tiny = WriteBytes("tiny.npy", full.substr(0, 9));
  EXPECT_FALSE(ReadNpy(tiny).ok());
  EXPECT_FALSE(ReadNpyHeader(tiny).ok());
}

TEST(NpyTest, TrailingBytesAreAnError) {
  std::string path = WriteBytes(
      "long.npy", HandMade(1,
                           "{'descr': '<f4', 'fortran_order': False, "
                           "'shape': (1,), }",
                           FloatBytes({1.f, 2.f})));
  EXPECT_THAT(ReadNpy(path).status().message(), HasSubstr("unexpected bytes"));
}

TEST(NpyTest, MalformedHeaders) {
  const std::vector<std::string> bad = {
      "{'descr': '<f4', 'fortran_order': False}",  // no shape
      "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1,), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': [1], }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
      "not a dict at all",
  };
  for (const std::string& dict : bad) {
    std::string path =
        WriteBytes("bad_header.npy", HandMade(1, dict, FloatBytes({1.f})));
    auto t = ReadNpy(path);
    ASSERT_FALSE(t.ok()) << dict;
    EXPECT_THAT(t.status().message(), HasSubstr(path)) << dict;
    EXPECT_THAT(t.status().message(), HasSubstr("header")) << dict;
  }
}

TEST(NpyTest, MissingFileIsNotFound) {
  std::string path = TmpPath("does_not_exist.npy");
  auto t = ReadNpy(path);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(t.status().message(), HasSubstr(path));
  EXPECT_EQ(ReadNpyHeader(path).status().code(), absl::StatusCode::kNotFound);
}

std::string F2File(const std::string& name, const std::string& shape,
                   const std::string& data) {
  return WriteBytes(name, HandMade(1,
                                   "{'descr': '<f2', 'fortran_order': False, "
                                   "'shape': " +
                                       shape + ", }",
                                   data));
}

TEST(NpyTest, Float16IsRefusedWithoutTheOption) {
  std::string path = F2File("f2_refused.npy", "(2,)", std::string(4, '\0'));
  auto header = ReadNpyHeader(path);
  ASSERT_FALSE(header.ok());
  EXPECT_EQ(header.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(header.status().message(),
            path + ": dtype '<f2' is not supported (expected <f4, <i4 or <i8)");
  EXPECT_EQ(ReadNpy(path).status().message(), header.status().message());
}

TEST(NpyTest, Float16HeaderWithTheOption) {
  std::string path = F2File("f2_ok.npy", "(3, 2)", std::string(12, '\0'));
  auto header = ReadNpyHeader(path, Float16Allowed());
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->dtype, DType::kFloat16);
  EXPECT_EQ(header->descr, "<f2");
  EXPECT_EQ(header->shape, (Shape{3, 2}));
  // float32 files are unchanged by the option.
  auto f32 = ReadNpyHeader(Fixture("npy_f32_2x3.npy"), Float16Allowed());
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_EQ(f32->dtype, DType::kFloat32);
  EXPECT_EQ(f32->descr, "<f4");
}

NpyReadOptions Bfloat16Allowed() {
  NpyReadOptions options;
  options.bfloat16_words = true;
  return options;
}

std::string WordsFile(const std::string& name, const std::string& descr,
                      int64_t n) {
  return WriteBytes(name, HandMade(1,
                                   "{'descr': '" + descr +
                                       "', 'fortran_order': False, "
                                       "'shape': (" +
                                       std::to_string(n) + ",), }",
                                   std::string(2 * n, '\0')));
}

TEST(NpyTest, Bfloat16WordsWithTheOption) {
  for (const std::string descr : {"<u2", "|V2", "<V2"}) {
    const std::string path = WordsFile("bf16_ok.npy", descr, 5);
    auto header = ReadNpyHeader(path, Bfloat16Allowed());
    ASSERT_TRUE(header.ok()) << descr << ": " << header.status();
    EXPECT_EQ(header->dtype, DType::kBFloat16);
    EXPECT_EQ(header->descr, descr);
    EXPECT_EQ(header->shape, Shape{5});
  }
  // 5 words are 10 bytes, not 20.
  const std::string longer = WriteBytes(
      "bf16_long.npy",
      HandMade(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (5,), }",
               std::string(20, '\0')));
  EXPECT_THAT(ReadNpyHeader(longer, Bfloat16Allowed()).status().message(),
              HasSubstr("10 unexpected bytes after the 10 bytes of data"));
}

TEST(NpyTest, Bfloat16WordsAreRefusedWithoutTheOption) {
  const std::string u2 = WordsFile("bf16_refused.npy", "<u2", 2);
  EXPECT_EQ(ReadNpyHeader(u2, Float16Allowed()).status().message(),
            u2 + ": dtype '<u2' is not supported (expected <f4, <f2, <i4 or "
                 "<i8)");
  // '<f2' is float16, not bfloat16.
  const std::string f2 = F2File("bf16_f2.npy", "(2,)", std::string(4, '\0'));
  EXPECT_EQ(ReadNpyHeader(f2, Bfloat16Allowed()).status().message(),
            f2 + ": dtype '<f2' is not supported (expected <f4, <u2 or |V2 "
                 "(bfloat16), <i4 or <i8)");
  // Void words of another width are not bfloat16.
  const std::string v4 = WriteBytes(
      "bf16_v4.npy",
      HandMade(1, "{'descr': '|V4', 'fortran_order': False, 'shape': (2,), }",
               std::string(8, '\0')));
  EXPECT_THAT(ReadNpyHeader(v4, Bfloat16Allowed()).status().message(),
              HasSubstr(v4 + ": dtype '|V4' is not supported"));
}

TEST(NpyTest, UnsupportedDescrIsQuotedBounded) {
  const std::string descr(200, 'z');
  const std::string path =
      WriteBytes("long_descr.npy", HandMade(1,
                                            "{'descr': '" + descr +
                                                "', 'fortran_order': False, "
                                                "'shape': (1,), }",
                                            std::string(4, '\0')));
  EXPECT_EQ(ReadNpyHeader(path).status().message(),
            path + ": dtype '" + std::string(16, 'z') +
                "...' is not supported (expected <f4, <i4 or <i8)");
}

TEST(NpyTest, Float16SizeCheckUsesTwoBytes) {
  // 3 halves are 6 bytes: 12 (as if float32) is too long, 4 too short.
  std::string long_path = F2File("f2_long.npy", "(3,)", std::string(12, '\0'));
  EXPECT_THAT(ReadNpyHeader(long_path, Float16Allowed()).status().message(),
              HasSubstr("6 unexpected bytes after the 6 bytes of data"));
  std::string short_path = F2File("f2_short.npy", "(3,)", std::string(4, '\0'));
  EXPECT_THAT(ReadNpyHeader(short_path, Float16Allowed()).status().message(),
              HasSubstr("truncated: header promises 6 bytes of data"));
}

// Runs `script` with Debian's python (numpy); false when it fails, e.g.
// where python3-numpy is missing.
bool RunNumpy(const std::string& name, const std::string& script) {
  const std::string path = WriteBytes(name, script);
  const int rc = std::system(absl::StrCat("/usr/bin/python3 ", path).c_str());
  return WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
}

constexpr char kNoNumpy[] =
    "SKIPPED: /usr/bin/python3 with numpy could not write the fixtures "
    "(apt-get install python3-numpy)";

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Values from numpy 1.24.2: np.uint16(h).view(np.float16).astype(np.float32).
TEST(NpyTest, Float16ToFloatMatchesNumpyTable) {
  const std::vector<std::pair<uint16_t, uint32_t>> table = {
      {0x0000, 0x00000000},  // 0.0
      {0x8000, 0x80000000},  // -0.0
      {0x0001, 0x33800000},  // smallest subnormal 2^-24
      {0x8001, 0xB3800000},  // -2^-24
      {0x03FF, 0x387FC000},  // largest subnormal
      {0x0400, 0x38800000},  // smallest normal 2^-14
      {0x3C00, 0x3F800000},  // 1.0
      {0xBC00, 0xBF800000},  // -1.0
      {0x3555, 0x3EAAA000},  // 0.333251953125
      {0x7BFF, 0x477FE000},  // 65504.0
      {0xFBFF, 0xC77FE000},  // -65504.0
      {0x7C00, 0x7F800000},  // inf
      {0xFC00, 0xFF800000},  // -inf
      {0x7E00, 0x7FC00000},  // quiet NaN
      {0x7C01, 0x7F802000},  // signalling NaN, payload kept
      {0xFE00, 0xFFC00000},  // negative NaN
      {0x7FFF, 0x7FFFE000},  // NaN, full payload
      {0x4248, 0x40490000},  // 3.140625
      {0x1234, 0x3A468000},  // 0.0007572174072265625
  };
  for (const auto& [half, want] : table) {
    EXPECT_EQ(FloatBits(Float16ToFloat(half)), want)
        << "half 0x" << std::hex << half;
  }
}

// Every one of the 65536 halves against numpy's widening, from files numpy
// writes ('<f2' and '<f4'). Skips, saying why, when Debian's python lacks
// numpy.
TEST(NpyTest, Float16ToFloatMatchesNumpyOnEveryValue) {
  const std::string f2 = TmpPath("all_f2.npy"), f4 = TmpPath("all_f4.npy");
  if (!RunNumpy(
          "all_halves.py",
          absl::StrCat("import numpy as np\n"
                       "h = np.arange(65536, dtype='<u2').view('<f2')\n"
                       "np.save('",
                       f2, "', h)\nnp.save('", f4, "', h.astype('<f4'))\n"))) {
    GTEST_SKIP() << kNoNumpy;
  }
  auto header = ReadNpyHeader(f2, Float16Allowed());
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_EQ(header->dtype, DType::kFloat16);
  ASSERT_EQ(header->shape, Shape{65536});
  auto bytes = ReadFileToString(f2);
  auto want = ReadNpy(f4);
  ASSERT_TRUE(bytes.ok() && want.ok());
  int mismatches = 0;
  for (int i = 0; i < 65536; ++i) {
    uint16_t half;
    std::memcpy(&half, bytes->data() + header->data_offset + 2 * i, 2);
    ASSERT_EQ(half, i);
    if (FloatBits(Float16ToFloat(half)) != FloatBits(want->data<float>()[i])) {
      ADD_FAILURE() << "half 0x" << std::hex << i;
      if (++mismatches > 10) break;
    }
  }
}

TEST(NpyTest, WriteRejectsUnsupportedDType) {
  Tensor t = Tensor::Zeros(DType::kUInt8, {2});
  auto s = WriteNpy(TmpPath("u8.npy"), t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("cannot write dtype uint8"));
}

// The 2-byte types are written as '<f2' and '<u2' (bfloat16 words), and read
// back with the options that allow them.
TEST(NpyTest, WritesHalfWidthTypes) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    Tensor t = Tensor::Empty(dtype, {2, 3});
    for (int i = 0; i < 6; ++i) {
      const uint16_t word = static_cast<uint16_t>(0x3C00 + 17 * i);
      std::memcpy(static_cast<char*>(t.raw_data()) + 2 * i, &word, 2);
    }
    const std::string path = TmpPath(absl::StrCat(DTypeName(dtype), ".npy"));
    ASSERT_TRUE(WriteNpy(path, t).ok());
    NpyReadOptions both;
    both.float16 = both.bfloat16_words = true;
    auto header = ReadNpyHeader(path, both);
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->dtype, dtype);
    EXPECT_EQ(header->descr, dtype == DType::kFloat16 ? "<f2" : "<u2");
    EXPECT_EQ(header->shape, (Shape{2, 3}));
    auto bytes = ReadFileToString(path);
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(bytes->substr(header->data_offset),
              std::string(static_cast<const char*>(t.raw_data()), 12));
  }
}

// Every half round-trips (NaNs stay NaN); ties go to even; the edges of the
// range as numpy rounds them (np.float32(x).astype(np.float16)).
TEST(NpyTest, FloatToFloat16RoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Float16ToFloat(static_cast<uint16_t>(h));
    const uint16_t back = FloatToFloat16(f);
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0) {
      EXPECT_EQ(back & 0x7C00, 0x7C00);
      EXPECT_NE(back & 0x3FF, 0) << std::hex << h;
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
  const std::vector<std::pair<float, uint16_t>> table = {
      {1.0f + 0x1p-11f, 0x3C00},             // tie between 1 and 1+2^-10: even
      {1.0f + 3 * 0x1p-11f, 0x3C02},         // tie, rounds up to even
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01},  // just past the tie
      {65504.f, 0x7BFF},                     // the largest half
      {65519.99f, 0x7BFF},                   // below half an ulp past it
      {65520.f, 0x7C00},                     // half an ulp past: inf
      {1e10f, 0x7C00},
      {-1e10f, 0xFC00},
      {0x1p-24f, 0x0001},             // the smallest subnormal
      {0x1p-25f, 0x0000},             // half of it: a tie, to even zero
      {0x1p-25f * 1.0001f, 0x0001},   // past the tie
      {-0x1p-26f, 0x8000},            // signed zero
      {3 * 0x1p-25f, 0x0002},         // 1.5 units: tie to even 2
      {0x1p-14f - 0x1p-25f, 0x0400},  // rounds up into the normals
      {0.1f, 0x2E66},
      {-2.5f, 0xC100},
  };
  for (const auto& [f, want] : table) {
    EXPECT_EQ(FloatToFloat16(f), want) << f;
  }
}

// Random float32 bit patterns against numpy's astype(np.float16). Skips,
// saying why, when Debian's python lacks numpy.
TEST(NpyTest, FloatToFloat16MatchesNumpy) {
  const std::string f4 = TmpPath("round_f4.npy"), f2 = TmpPath("round_f2.npy");
  if (!RunNumpy("round_halves.py",
                absl::StrCat(
                    "import numpy as np\n"
                    "r = np.random.default_rng(5)\n"
                    "u = r.integers(0, 2**32, size=200000, dtype=np.uint64)\n"
                    "u = np.concatenate([u.astype('<u4'),\n"
                    "    r.integers(0x33000000, 0x47800000, "
                    "size=200000).astype('<u4')])\n"
                    "x = u.view('<f4')\n"
                    "x = x[~np.isnan(x)]\n"
                    "np.save('",
                    f4, "', x)\nnp.save('", f2,
                    "', x.astype('<f2').view('<u2').astype('<i4'))\n"))) {
    GTEST_SKIP() << kNoNumpy;
  }
  auto x = ReadNpy(f4);
  auto h = ReadNpy(f2);  // int32: the halves' bits
  ASSERT_TRUE(x.ok() && h.ok());
  ASSERT_EQ(x->numel(), h->numel());
  ASSERT_GT(x->numel(), 300000);
  int mismatches = 0;
  for (int64_t i = 0; i < x->numel(); ++i) {
    const float f = x->data<float>()[i];
    const uint16_t want = static_cast<uint16_t>(h->data<int32_t>()[i]);
    if (FloatToFloat16(f) != want) {
      ADD_FAILURE() << "float 0x" << std::hex << FloatBits(f) << ": got 0x"
                    << FloatToFloat16(f) << ", numpy 0x" << want;
      if (++mismatches > 10) break;
    }
  }
}

}  // namespace
}  // namespace trainyard
