#include "core/npy.h"

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

TEST(NpyTest, WriteRejectsUnsupportedDType) {
  Tensor t = Tensor::Zeros(DType::kBFloat16, {2});
  auto s = WriteNpy(TmpPath("bf16.npy"), t);
  EXPECT_THAT(s.message(), HasSubstr("bfloat16"));
}

}  // namespace
}  // namespace trainyard
