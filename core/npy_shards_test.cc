#include "core/npy_shards.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/bfloat16.h"
#include "core/file_util.h"
#include "core/host_info.h"
#include "core/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

// A path in the test's scratch folder ($TEST_TMPDIR under bazel test).
std::string TmpPath(const std::string& name) {
  return JoinPath(::testing::TempDir(), name);
}

std::string Write(const std::string& name, const Tensor& t) {
  const std::string path = TmpPath(name);
  EXPECT_TRUE(WriteNpy(path, t).ok()) << path;
  return path;
}

// A version 1.0 .npy file by hand (for dtypes WriteNpy does not write).
std::string WriteRaw(const std::string& name, const std::string& descr,
                     const std::string& shape, const std::string& data) {
  const std::string dict =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': ", shape, ", }\n");
  std::string bytes("\x93NUMPY\x01\x00", 8);
  bytes.push_back(static_cast<char>(dict.size() & 0xFF));
  bytes.push_back(static_cast<char>(dict.size() >> 8));
  const std::string path = TmpPath(name);
  EXPECT_TRUE(WriteFileAtomically(path, bytes + dict + data).ok()) << path;
  return path;
}

// Features [rows, d] with distinct values: row r (of the whole source,
// `first` + local row), column j holds r * 1000 + j.
Tensor Features(int64_t first, int64_t rows, int64_t d) {
  Tensor t = Tensor::Empty(DType::kFloat32, {rows, d});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < d; ++j) {
      t.data<float>()[r * d + j] = static_cast<float>((first + r) * 1000 + j);
    }
  }
  return t;
}

// Targets for rows [first, first + rows): class id 7 * r of `dtype`, or for
// float32 a [rows, k] matrix holding r + j / 10.
Tensor Targets(DType dtype, int64_t first, int64_t rows, int64_t k) {
  if (dtype == DType::kFloat32) {
    Tensor t = Tensor::Empty(dtype, {rows, k});
    for (int64_t i = 0; i < rows * k; ++i) {
      t.data<float>()[i] = static_cast<float>(first + i / k) + (i % k) / 10.f;
    }
    return t;
  }
  Tensor t = Tensor::Empty(dtype, {rows});
  for (int64_t r = 0; r < rows; ++r) {
    if (dtype == DType::kInt32) {
      t.data<int32_t>()[r] = static_cast<int32_t>(7 * (first + r));
    } else {
      t.data<int64_t>()[r] = (int64_t{1} << 40) + 7 * (first + r);
    }
  }
  return t;
}

struct Files {
  std::vector<std::string> features, targets;
  Tensor all_x, all_y;  // the concatenation, in memory
};

// Shards of the given row counts, D = 3, targets of `dtype` (K = 2 for
// float32), named <prefix>x_i.npy / <prefix>y_i.npy.
Files MakeShards(const std::string& prefix, const std::vector<int64_t>& rows,
                 DType dtype) {
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  const int64_t k = dtype == DType::kFloat32 ? 2 : 0;
  Files f;
  f.all_x = Features(0, total, 3);
  f.all_y = Targets(dtype, 0, total, k);
  int64_t first = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    f.features.push_back(Write(absl::StrCat(prefix, "x_", i, ".npy"),
                               Features(first, rows[i], 3)));
    f.targets.push_back(Write(absl::StrCat(prefix, "y_", i, ".npy"),
                              Targets(dtype, first, rows[i], k)));
    first += rows[i];
  }
  return f;
}

// `features` (written already, of `rows` rows each) paired with class-id
// targets of `dtype` for the same rows, named <prefix>y_i.npy.
Files WithTargets(const std::string& prefix, std::vector<std::string> features,
                  const std::vector<int64_t>& rows, DType dtype) {
  Files f;
  f.features = std::move(features);
  int64_t first = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    f.targets.push_back(Write(absl::StrCat(prefix, "y_", i, ".npy"),
                              Targets(dtype, first, rows[i], 0)));
    first += rows[i];
  }
  return f;
}

// Row `r` of `t` (any dtype) as bytes.
std::string RowBytes(const Tensor& t, int64_t r) {
  const size_t row = t.nbytes() / t.dim(0);
  return std::string(static_cast<const char*>(t.raw_data()) + r * row, row);
}

// Checks Gather(rows) against the in-memory concatenation.
void ExpectGatherMatches(const NpyShards& source, const Files& f,
                         const std::vector<int64_t>& rows, int64_t offset) {
  auto got = source.Gather(rows);
  ASSERT_TRUE(got.ok()) << got.status();
  const auto& [x, y] = *got;
  ASSERT_EQ(x.shape(), (Shape{static_cast<int64_t>(rows.size()), 3}));
  ASSERT_EQ(y.dtype(), f.all_y.dtype());
  ASSERT_EQ(y.dim(0), static_cast<int64_t>(rows.size()));
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(RowBytes(x, i), RowBytes(f.all_x, offset + rows[i])) << i;
    EXPECT_EQ(RowBytes(y, i), RowBytes(f.all_y, offset + rows[i])) << i;
  }
}

std::shared_ptr<const NpyShards> MustOpen(const Files& f) {
  auto source = NpyShards::Open(f.features, f.targets);
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? *source : nullptr;
}

std::vector<int64_t> Shuffled(int64_t n, uint32_t seed) {
  std::vector<int64_t> rows(n);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), std::mt19937(seed));
  return rows;
}

TEST(NpyShardsTest, GatherEqualsTheConcatenation) {
  Files f = MakeShards("cat_", {5, 1, 9}, DType::kInt64);
  auto source = MustOpen(f);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->num_rows(), 15);
  EXPECT_EQ(source->num_features(), 3);
  EXPECT_EQ(source->target_dtype(), DType::kInt64);
  EXPECT_EQ(source->target_width(), 0);
  EXPECT_EQ(source->num_shards(), 3);
  EXPECT_EQ(source->bytes(), 15u * (3 * 4 + 8));
  ExpectGatherMatches(*source, f, Shuffled(15, 1), 0);
  // Across every shard boundary, repeats, and the single-row shard.
  ExpectGatherMatches(*source, f, {4, 5, 6, 14, 0, 0, 5}, 0);
  ExpectGatherMatches(*source, f, {}, 0);
}

TEST(NpyShardsTest, Int32Targets) {
  Files f = MakeShards("i32_", {4, 6}, DType::kInt32);
  auto source = MustOpen(f);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->target_dtype(), DType::kInt32);
  ExpectGatherMatches(*source, f, Shuffled(10, 2), 0);
}

TEST(NpyShardsTest, Float32WideTargets) {
  Files f = MakeShards("f32_", {3, 2, 7}, DType::kFloat32);
  auto source = MustOpen(f);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->target_dtype(), DType::kFloat32);
  EXPECT_EQ(source->target_width(), 2);
  EXPECT_EQ(source->bytes(), 12u * (3 * 4 + 2 * 4));
  auto got = source->Gather({11, 3});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->second.shape(), (Shape{2, 2}));
  EXPECT_EQ(got->second.data<float>()[1], 11.1f);
  ExpectGatherMatches(*source, f, Shuffled(12, 3), 0);
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Halves and their float32 widening by numpy
// (np.uint16(h).view(np.float16).astype(np.float32)).
TEST(NpyShardsTest, Float16FeaturesWidenExactly) {
  const std::vector<uint16_t> halves = {0x0001, 0x8000, 0x03FF, 0x3555,
                                        0x7BFF, 0xFC00, 0x7E00, 0x7C01};
  const std::vector<uint32_t> want = {0x33800000, 0x80000000, 0x387FC000,
                                      0x3EAAA000, 0x477FE000, 0xFF800000,
                                      0x7FC00000, 0x7F802000};
  std::string data(reinterpret_cast<const char*>(halves.data()), 16);
  Files f;
  // Shard 0 float16 [4, 2], shard 1 float32 [1, 2]: mixed widths are fine.
  f.features = {WriteRaw("h_x_0.npy", "<f2", "(4, 2)", data),
                Write("h_x_1.npy", Tensor::FromVector({1.5f, -2.f}, {1, 2}))};
  f.targets = {Write("h_y_0.npy", Targets(DType::kInt32, 0, 4, 0)),
               Write("h_y_1.npy", Targets(DType::kInt32, 4, 1, 0))};
  auto source = MustOpen(f);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->bytes(), 4u * (2 * 2 + 4) + 1u * (2 * 4 + 4));
  auto got = source->Gather({3, 4, 0, 1, 2});
  ASSERT_TRUE(got.ok()) << got.status();
  const Tensor& x = got->first;
  ASSERT_EQ(x.dtype(), DType::kFloat32);
  ASSERT_EQ(x.shape(), (Shape{5, 2}));
  const std::vector<int> order = {3, 4, 0, 1, 2};
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 2; ++j) {
      const float v = x.data<float>()[i * 2 + j];
      if (order[i] == 4) {
        EXPECT_EQ(v, j == 0 ? 1.5f : -2.f);
      } else {
        EXPECT_EQ(Bits(v), want[order[i] * 2 + j]) << i << "," << j;
      }
    }
  }
  EXPECT_EQ(got->second.data<int32_t>()[0], 21);
}

// bfloat16 words: zeros, a subnormal, 1, pi's neighbour, the largest
// finite, infinities and NaNs (their payloads kept by the widening).
const std::vector<uint16_t> kBf16Words = {0x0000, 0x8000, 0x0001, 0x3F80,
                                          0x4049, 0x7F7F, 0xFF80, 0x7FC0,
                                          0x7F81, 0xC2F7, 0x3E2A, 0xB5A1};

std::string WordBytes(const std::vector<uint16_t>& words) {
  return std::string(reinterpret_cast<const char*>(words.data()),
                     2 * words.size());
}

// Two bfloat16 shards, [4, 2] as '<u2' and [2, 2] as '|V2', of kBf16Words,
// with int32 targets.
Files Bf16Shards(const std::string& prefix, const std::string& descr1 = "|V2") {
  const std::vector<uint16_t>& w = kBf16Words;
  return WithTargets(prefix,
                     {WriteRaw(prefix + "x_0.npy", "<u2", "(4, 2)",
                               WordBytes({w.begin(), w.begin() + 8})),
                      WriteRaw(prefix + "x_1.npy", descr1, "(2, 2)",
                               WordBytes({w.begin() + 8, w.end()}))},
                     {4, 2}, DType::kInt32);
}

std::shared_ptr<const NpyShards> MustOpenBf16(const Files& f) {
  NpyShardsOptions options;
  options.bfloat16_features = true;
  auto source = NpyShards::Open(f.features, f.targets, options);
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? *source : nullptr;
}

TEST(NpyShardsTest, Bfloat16FeaturesWidenExactly) {
  Files f = Bf16Shards("bf_");
  auto source = MustOpenBf16(f);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->feature_dtype(), DType::kBFloat16);
  EXPECT_EQ(source->num_features(), 2);
  EXPECT_EQ(source->bytes(), 6u * (2 * 2 + 4));
  const std::vector<int64_t> rows = {5, 0, 3, 1, 4, 2, 3};
  auto got = source->Gather(rows);
  ASSERT_TRUE(got.ok()) << got.status();
  const Tensor& x = got->first;
  ASSERT_EQ(x.dtype(), DType::kFloat32);
  ASSERT_EQ(x.shape(), (Shape{7, 2}));
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int j = 0; j < 2; ++j) {
      const uint16_t word = kBf16Words[rows[i] * 2 + j];
      EXPECT_EQ(Bits(x.data<float>()[i * 2 + j]), Bits(Bf16ToFloat(word)))
          << i << "," << j;
      EXPECT_EQ(Bits(x.data<float>()[i * 2 + j]), uint32_t{word} << 16);
    }
    EXPECT_EQ(got->second.data<int32_t>()[i], 7 * rows[i]);
  }
}

// The words of `rows` of a 2-wide kBf16Words-like table, as bytes.
std::string WordRows(const std::vector<uint16_t>& words,
                     const std::vector<int64_t>& rows) {
  std::string out;
  for (int64_t r : rows) out += WordBytes({words[2 * r], words[2 * r + 1]});
  return out;
}

TEST(NpyShardsTest, GatherIntoStoredDTypeCopiesTheFileBytes) {
  Files f = Bf16Shards("bf_into_");
  auto source = MustOpenBf16(f);
  ASSERT_NE(source, nullptr);
  const std::vector<int64_t> rows = {4, 4, 0, 5, 2};
  Tensor x = Tensor::Empty(DType::kBFloat16, {5, 2});
  Tensor y = Tensor::Empty(DType::kInt32, {5});
  ASSERT_TRUE(source->GatherInto(rows, &x, &y).ok());
  EXPECT_EQ(std::string(static_cast<const char*>(x.raw_data()), x.nbytes()),
            WordRows(kBf16Words, rows));
  EXPECT_EQ(y.data<int32_t>()[3], 35);
  // float16 the same way: the halves as they are in the file.
  const std::vector<uint16_t> halves = {0x3C00, 0x0001, 0x7BFF,
                                        0xFC00, 0x7E00, 0x3555};
  Files h =
      WithTargets("h_into_",
                  {WriteRaw("h_into_x_0.npy", "<f2", "(1, 2)",
                            WordBytes({halves[0], halves[1]})),
                   WriteRaw("h_into_x_1.npy", "<f2", "(2, 2)",
                            WordBytes({halves.begin() + 2, halves.end()}))},
                  {1, 2}, DType::kInt64);
  auto halves_source = MustOpen(h);
  ASSERT_NE(halves_source, nullptr);
  EXPECT_EQ(halves_source->feature_dtype(), DType::kFloat16);
  Tensor hx = Tensor::Empty(DType::kFloat16, {3, 2});
  Tensor hy = Tensor::Empty(DType::kInt64, {3});
  ASSERT_TRUE(halves_source->GatherInto({2, 0, 1}, &hx, &hy).ok());
  EXPECT_EQ(std::string(static_cast<const char*>(hx.raw_data()), hx.nbytes()),
            WordRows(halves, {2, 0, 1}));
}

TEST(NpyShardsTest, GatherIntoFloat32EqualsGather) {
  Files f = Bf16Shards("bf_f32_");
  auto source = MustOpenBf16(f);
  ASSERT_NE(source, nullptr);
  const std::vector<int64_t> rows = Shuffled(6, 9);
  auto want = source->Gather(rows);
  ASSERT_TRUE(want.ok()) << want.status();
  Tensor x = Tensor::Empty(DType::kFloat32, {6, 2});
  Tensor y = Tensor::Empty(DType::kInt32, {6});
  ASSERT_TRUE(source->GatherInto(rows, &x, &y).ok());
  EXPECT_EQ(RowBytes(x.View({1, 12}), 0),
            RowBytes(want->first.View({1, 12}), 0));
  EXPECT_EQ(RowBytes(y.View({1, 6}), 0),
            RowBytes(want->second.View({1, 6}), 0));
  // float32 files, float32 wide targets, into tensors that are views.
  Files g = MakeShards("into_f32_", {3, 4}, DType::kFloat32);
  auto plain = MustOpen(g);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->feature_dtype(), DType::kFloat32);
  Tensor gx = Tensor::Zeros(DType::kFloat32, {10, 3});
  Tensor gy = Tensor::Zeros(DType::kFloat32, {10, 2});
  Tensor into_x = gx.Rows(2, 9), into_y = gy.Rows(2, 9);
  ASSERT_TRUE(plain->GatherInto(Shuffled(7, 10), &into_x, &into_y).ok());
  auto g_want = plain->Gather(Shuffled(7, 10));
  ASSERT_TRUE(g_want.ok());
  for (int64_t i = 0; i < 7; ++i) {
    EXPECT_EQ(RowBytes(gx, i + 2), RowBytes(g_want->first, i)) << i;
    EXPECT_EQ(RowBytes(gy, i + 2), RowBytes(g_want->second, i)) << i;
  }
  EXPECT_EQ(RowBytes(gx, 0), std::string(12, '\0'));  // outside untouched
  EXPECT_EQ(RowBytes(gx, 9), std::string(12, '\0'));
}

TEST(NpyShardsTest, MixedFloat32AndFloat16AreStoredAsFloat32) {
  Files f = WithTargets(
      "mix_",
      {WriteRaw("mix_x_0.npy", "<f2", "(1, 2)", WordBytes({0x3C00, 0xC000})),
       Write("mix_x_1.npy", Tensor::FromVector({1.5f, -2.f}, {1, 2}))},
      {1, 1}, DType::kInt32);
  auto source = MustOpen(f);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->feature_dtype(), DType::kFloat32);
  Tensor half = Tensor::Empty(DType::kFloat16, {2, 2});
  Tensor y = Tensor::Empty(DType::kInt32, {2});
  absl::Status s = source->GatherInto({0, 1}, &half, &y);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "npy shards: the features tensor is float16 [2, 2], but a batch "
            "of 2 rows needs a host tensor float32 [2, 2]");
  Tensor x = Tensor::Empty(DType::kFloat32, {2, 2});
  ASSERT_TRUE(source->GatherInto({1, 0}, &x, &y).ok());
  EXPECT_EQ(x.data<float>()[0], 1.5f);
  EXPECT_EQ(x.data<float>()[3], -2.f);
}

TEST(NpyShardsTest, GatherIntoRefusesMismatchedTensors) {
  Files f = Bf16Shards("bf_shapes_");
  auto source = MustOpenBf16(f);
  ASSERT_NE(source, nullptr);
  const std::vector<int64_t> rows = {0, 1, 2};
  struct Case {
    Tensor x, y;
    std::string message;
  };
  const std::string x_needs =
      ", but a batch of 3 rows needs a host tensor float32 or bfloat16 [3, 2]";
  const std::string y_needs =
      ", but a batch of 3 rows needs a host tensor int32 [3]";
  const std::vector<Case> cases = {
      {Tensor::Empty(DType::kBFloat16, {2, 2}),
       Tensor::Empty(DType::kInt32, {3}),
       "the features tensor is bfloat16 [2, 2]" + x_needs},
      {Tensor::Empty(DType::kBFloat16, {3, 3}),
       Tensor::Empty(DType::kInt32, {3}),
       "the features tensor is bfloat16 [3, 3]" + x_needs},
      {Tensor::Empty(DType::kFloat16, {3, 2}),
       Tensor::Empty(DType::kInt32, {3}),
       "the features tensor is float16 [3, 2]" + x_needs},
      {Tensor::Empty(DType::kFloat32, {6}), Tensor::Empty(DType::kInt32, {3}),
       "the features tensor is float32 [6]" + x_needs},
      {Tensor::Empty(DType::kFloat32, {3, 2}),
       Tensor::Empty(DType::kInt64, {3}),
       "the targets tensor is int64 [3]" + y_needs},
      {Tensor::Empty(DType::kFloat32, {3, 2}),
       Tensor::Empty(DType::kInt32, {3, 1}),
       "the targets tensor is int32 [3, 1]" + y_needs},
      {Tensor(), Tensor(), "the features tensor is float32 [0]" + x_needs},
  };
  for (Case c : cases) {
    absl::Status s = source->GatherInto(rows, &c.x, &c.y);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(s.message(), "npy shards: " + c.message);
  }
  // A row out of range is named before the tensors are looked at.
  Tensor x = Tensor::Empty(DType::kFloat32, {1, 2});
  Tensor y = Tensor::Empty(DType::kInt32, {1});
  EXPECT_THAT(source->GatherInto({6}, &x, &y).message(),
              HasSubstr("row 6 (batch position 0) is out of range [0, 6)"));
}

TEST(NpyShardsTest, Bfloat16OptionRefusesOtherFeatureFiles) {
  Files f = Bf16Shards("bf_refuse_");
  NpyShardsOptions bf16;
  bf16.bfloat16_features = true;
  // A float32 file where bfloat16 words are promised.
  const std::string f4 =
      Write("bf_refuse_f4.npy", Tensor::FromVector({1.f, 2.f}, {1, 2}));
  const std::string y1 =
      Write("bf_refuse_y1.npy", Targets(DType::kInt32, 0, 1, 0));
  absl::Status s =
      NpyShards::Open({f.features[0], f4}, {f.targets[0], y1}, bf16).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), f4 + ": dtype '<f4', but features_dtype is bfloat16 "
                              "(expected '<u2' or '|V2')");
  // float16 is not bfloat16 either.
  const std::string f2 =
      WriteRaw("bf_refuse_f2.npy", "<f2", "(1, 2)", WordBytes({1, 2}));
  EXPECT_EQ(NpyShards::Open({f2}, {y1}, bf16).status().message(),
            f2 + ": dtype '<f2', but features_dtype is bfloat16 (expected "
                 "'<u2' or '|V2')");
  // 4-byte void words are not bfloat16.
  const std::string v4 =
      WriteRaw("bf_refuse_v4.npy", "|V4", "(1, 2)", std::string(8, '\0'));
  s = NpyShards::Open({v4}, {y1}, bf16).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(v4 + ": dtype '|V4' is not supported"));
  // '<u2' (and '|V2') words without the option.
  for (const std::string& words : f.features) {
    s = NpyShards::Open({words}, {f.targets[0]}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(words + ": dtype '"));
    EXPECT_THAT(s.message(),
                HasSubstr("' holds 2-byte words: bfloat16 features need "
                          "features_dtype \"bfloat16\"; otherwise features "
                          "are float32 or float16"));
  }
  // bfloat16 targets are not a thing: the option is for features only.
  const std::string u2_targets =
      WriteRaw("bf_refuse_yu2.npy", "<u2", "(4,)", WordBytes({1, 2, 3, 4}));
  EXPECT_THAT(
      NpyShards::Open({f.features[0]}, {u2_targets}, bf16).status().message(),
      HasSubstr(u2_targets + ": dtype '<u2' is not supported"));
}

// The number of descriptors this process has open.
int OpenDescriptors() {
  auto names = ListFolder("/proc/self/fd");
  EXPECT_TRUE(names.ok()) << names.status();
  return names.ok() ? static_cast<int>(names->size()) : -1;
}

// With RLIMIT_NOFILE at 64, 200 pairs (400 files) open and gather: no
// descriptor stays open per file.
TEST(NpyShardsTest, ManyPairsStayWithinTheDescriptorLimit) {
  std::vector<int64_t> counts(200);
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = 1 + i % 3;
  Files f = MakeShards("nofile_", counts, DType::kInt64);
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int before = OpenDescriptors();
  ASSERT_LT(before, 48) << "the test process already has many descriptors";
  struct rlimit low = saved;
  low.rlim_cur = 64;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  auto source = NpyShards::Open(f.features, f.targets);
  absl::StatusOr<std::pair<Tensor, Tensor>> got(absl::UnknownError("unset"));
  const int total = static_cast<int>(source.ok() ? (*source)->num_rows() : 0);
  std::vector<int64_t> rows = Shuffled(total, 11);
  if (source.ok()) got = (*source)->Gather(rows);
  const int during = OpenDescriptors();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->num_shards(), 200);
  EXPECT_EQ(during, before);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(RowBytes(got->first, i), RowBytes(f.all_x, rows[i])) << i;
    EXPECT_EQ(RowBytes(got->second, i), RowBytes(f.all_y, rows[i])) << i;
  }
}

// Deleting a file (its mapping lives on) is DataLoss naming it.
TEST(NpyShardsTest, FileDeletedIsDataLoss) {
  Files f = MakeShards("deleted_", {2, 3}, DType::kInt32);
  auto source = MustOpen(f);
  ASSERT_NE(source, nullptr);
  ASSERT_EQ(std::remove(f.features[1].c_str()), 0);
  EXPECT_TRUE(source->Gather({0, 1}).ok());
  auto got = source->Gather({3});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(got.status().message(),
            f.features[1] +
                ": changed since the job opened it (the path no longer names "
                "a file: No such file or directory)");
}

TEST(NpyShardsTest, SliceHoldsTheParentsRows) {
  Files f = MakeShards("slice_", {5, 1, 9}, DType::kInt32);
  auto source = MustOpen(f);
  ASSERT_NE(source, nullptr);
  auto tail = source->Slice(4, 15);  // last row of shard 0 onwards
  EXPECT_EQ(tail->num_rows(), 11);
  EXPECT_EQ(tail->num_shards(), 3);
  EXPECT_EQ(tail->bytes(), 11u * (3 * 4 + 4));
  ExpectGatherMatches(*tail, f, Shuffled(11, 4), 4);
  auto inner = tail->Slice(2, 5);  // source rows [6, 9), all in shard 2
  EXPECT_EQ(inner->num_rows(), 3);
  EXPECT_EQ(inner->num_shards(), 1);
  ExpectGatherMatches(*inner, f, {2, 0, 1}, 6);
  EXPECT_EQ(source->Slice(3, 3)->num_shards(), 0);
  auto out = inner->Gather({3});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("row 3"));
  EXPECT_THAT(out.status().message(), HasSubstr("[0, 3)"));
}

TEST(NpyShardsTest, ConcurrentGathersAreCorrect) {
  Files f = MakeShards("threads_", {700, 300, 1000}, DType::kInt64);
  auto source = MustOpen(f);
  ASSERT_NE(source, nullptr);
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t round = 0; round < 20; ++round) {
        ExpectGatherMatches(*source, f, Shuffled(2000, 100 * t + round), 0);
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(NpyShardsTest, RowOutOfRangeNamesIt) {
  Files f = MakeShards("range_", {2, 3}, DType::kInt32);
  auto source = MustOpen(f);
  ASSERT_NE(source, nullptr);
  for (int64_t bad : {int64_t{5}, int64_t{-1}}) {
    auto got = source->Gather({0, bad});
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(got.status().message(),
              absl::StrCat("npy shards: row ", bad,
                           " (batch position 1) is out of range [0, 5)"));
  }
}

// Opens `features`/`targets` and returns the error (OK if it opened).
absl::Status OpenError(const std::vector<std::string>& features,
                       const std::vector<std::string>& targets) {
  return NpyShards::Open(features, targets).status();
}

TEST(NpyShardsTest, RefusesBadLists) {
  Files f = MakeShards("lists_", {2, 2}, DType::kInt32);
  absl::Status s = OpenError(f.features, {f.targets[0]});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("got 2 feature and 1 target files"));
  s = OpenError({}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("got 0 feature and 0 target files"));
  s = OpenError({"x.npy"}, {f.targets[0]});
  EXPECT_EQ(s.message(), "x.npy: shard paths must be absolute");
}

TEST(NpyShardsTest, RefusesMissingFile) {
  Files f = MakeShards("missing_", {2}, DType::kInt32);
  const std::string gone = TmpPath("missing_y_9.npy");
  absl::Status s = OpenError(f.features, {gone});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), gone + ": cannot open: No such file or directory");
}

TEST(NpyShardsTest, RefusesNonNpyAndTruncatedFiles) {
  Files f = MakeShards("bytes_", {4}, DType::kInt32);
  const std::string text = TmpPath("bytes_text.npy");
  ASSERT_TRUE(WriteFileAtomically(text, "a,b\n1,2\n").ok());
  absl::Status s = OpenError({text}, f.targets);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), text + ": not a .npy file (missing \\x93NUMPY magic)");
  auto whole = ReadFileToString(f.features[0]);
  ASSERT_TRUE(whole.ok());
  const std::string cut = TmpPath("bytes_cut.npy");
  ASSERT_TRUE(
      WriteFileAtomically(cut, whole->substr(0, whole->size() - 5)).ok());
  s = OpenError({cut}, f.targets);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(cut + ": truncated: header promises 48 "
                                           "bytes of data"));
  s = OpenError({TmpPath("")}, f.targets);  // a folder
  EXPECT_THAT(s.message(), HasSubstr("not a regular file"));
}

TEST(NpyShardsTest, RefusesBadFeatures) {
  Files f = MakeShards("feat_", {2}, DType::kInt32);
  const std::string f8 =
      WriteRaw("feat_f8.npy", "<f8", "(2, 3)", std::string(48, '\0'));
  absl::Status s = OpenError({f8}, f.targets);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), f8 + ": dtype '<f8' is not supported (expected "
                              "<f4, <f2, <u2 or |V2 (bfloat16), <i4 or <i8)");
  const std::string flat =
      Write("feat_1d.npy", Tensor::FromVector({1.f, 2.f}, {2}));
  EXPECT_EQ(OpenError({flat}, f.targets).message(),
            flat + ": features must be 2-D [rows, features], got shape [2]");
  const std::string ints =
      Write("feat_i32.npy", Targets(DType::kInt32, 0, 2, 0).View({2, 1}));
  EXPECT_EQ(OpenError({ints}, f.targets).message(),
            ints + ": features must be float32 or float16, got int32");
  const std::string empty =
      Write("feat_empty.npy", Tensor::Empty(DType::kFloat32, {0, 3}));
  const std::string empty_y =
      Write("feat_empty_y.npy", Tensor::Empty(DType::kInt32, {0}));
  EXPECT_EQ(OpenError({empty}, {empty_y}).message(),
            empty +
                ": has no rows (shape [0, 3]); empty shards are not "
                "allowed");
}

TEST(NpyShardsTest, RefusesFeatureWidthChangingBetweenShards) {
  Files f = MakeShards("width_", {2, 2}, DType::kInt32);
  f.features[1] = Write("width_x_1.npy", Features(2, 2, 4));
  EXPECT_EQ(
      OpenError(f.features, f.targets).message(),
      f.features[1] + ": 4 features per row, but " + f.features[0] + " has 3");
}

TEST(NpyShardsTest, RefusesTargetsChangingBetweenShards) {
  Files f = MakeShards("tdtype_", {2, 2}, DType::kInt32);
  f.targets[1] = Write("tdtype_y_1.npy", Targets(DType::kInt64, 2, 2, 0));
  EXPECT_EQ(OpenError(f.features, f.targets).message(),
            f.targets[1] + ": targets are int64 of width 0, but " +
                f.targets[0] + "'s are int32 of width 0");
  Files g = MakeShards("tk_", {2, 2}, DType::kFloat32);
  g.targets[1] = Write("tk_y_1.npy", Targets(DType::kFloat32, 2, 2, 5));
  EXPECT_EQ(OpenError(g.features, g.targets).message(),
            g.targets[1] + ": targets are float32 of width 5, but " +
                g.targets[0] + "'s are float32 of width 2");
}

TEST(NpyShardsTest, RefusesBadTargetShapes) {
  Files f = MakeShards("tshape_", {2}, DType::kInt32);
  const std::string ids =
      Write("tshape_ids.npy", Targets(DType::kInt64, 0, 2, 0).View({2, 1}));
  EXPECT_EQ(OpenError(f.features, {ids}).message(),
            ids +
                ": int64 targets (class ids) must be 1-D [rows], got "
                "shape [2, 1]");
  const std::string flat =
      Write("tshape_flat.npy", Tensor::FromVector({1.f, 2.f}, {2}));
  EXPECT_EQ(OpenError(f.features, {flat}).message(),
            flat +
                ": float32 targets must be 2-D [rows, K] with K >= 1, got "
                "shape [2]");
}

TEST(NpyShardsTest, RefusesPairWithDifferentRowCounts) {
  Files f = MakeShards("pair_", {2, 3}, DType::kInt32);
  f.targets[1] = Write("pair_y_1.npy", Targets(DType::kInt32, 2, 4, 0));
  absl::Status s = OpenError(f.features, f.targets);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), f.features[1] + " has 3 rows but its targets " +
                             f.targets[1] + " have 4");
}

// Sets `path`'s mtime `seconds` after its current one.
void AdvanceMtime(const std::string& path, int seconds) {
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  times[1].tv_sec += seconds;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

TEST(NpyShardsTest, FileRewrittenInPlaceIsDataLoss) {
  Files f = MakeShards("rewrite_", {2, 3}, DType::kInt32);
  auto source = MustOpen(f);
  ASSERT_NE(source, nullptr);
  ASSERT_TRUE(source->Gather({0, 4}).ok());
  // Same size, new bytes at the end (in the data), later mtime.
  const int fd = ::open(f.features[1].c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  auto size = FileSize(f.features[1]);
  ASSERT_TRUE(size.ok());
  ASSERT_EQ(::pwrite(fd, "\x7f\x7f\x7f\x7f", 4, *size - 4), 4);
  ::close(fd);
  AdvanceMtime(f.features[1], 5);
  EXPECT_TRUE(source->Gather({0, 1}).ok());  // shard 0 is untouched
  auto got = source->Gather({0, 4});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(),
              HasSubstr(f.features[1] + ": changed since the job opened it "
                                        "(mtime "));
}

TEST(NpyShardsTest, FileReplacedIsDataLoss) {
  Files f = MakeShards("replace_", {2, 3}, DType::kInt32);
  auto source = MustOpen(f);
  ASSERT_NE(source, nullptr);
  // Renamed over with the very same bytes: a different file all the same.
  auto bytes = ReadFileToString(f.targets[0]);
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(WriteFileAtomically(f.targets[0], *bytes).ok());
  EXPECT_TRUE(source->Gather({2, 3, 4}).ok());
  auto got = source->Gather({4, 1});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(got.status().message(),
              HasSubstr(f.targets[0] + ": changed since the job opened it ("));
  EXPECT_THAT(got.status().message(), HasSubstr("the path names another file"));
}

// A field of /proc/self/status in bytes (e.g. "VmRSS").
int64_t ProcStatusBytes(absl::string_view field) {
  absl::StatusOr<uint64_t> bytes = ProcessStatusBytes(field);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? static_cast<int64_t>(*bytes) : 0;
}

// Float32 [rows, 256] features in `shards` shards (256 MiB when
// shards * rows = 262144): gathering every row once, in random batches of
// 256, leaves the resident set about where it was, since each Gather drops
// the pages it touched.
void ExpectResidentSetStaysAboutOneBatch(const std::string& prefix,
                                         int64_t shards, int64_t rows) {
  constexpr int64_t kD = 256, kBatch = 256;
  Files f;
  for (int64_t s = 0; s < shards; ++s) {
    Tensor x = Tensor::Empty(DType::kFloat32, {rows, kD});
    for (int64_t r = 0; r < rows; ++r) {
      std::fill_n(x.data<float>() + r * kD, kD,
                  static_cast<float>(s * rows + r));
    }
    f.features.push_back(Write(absl::StrCat(prefix, "x_", s, ".npy"), x));
    f.targets.push_back(Write(absl::StrCat(prefix, "y_", s, ".npy"),
                              Targets(DType::kInt32, s * rows, rows, 0)));
  }
  auto source = MustOpen(f);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->bytes(),
            static_cast<uint64_t>(shards * rows) * (kD + 1) * 4);
  const std::vector<int64_t> order = Shuffled(shards * rows, 5);
  const int64_t before = ProcStatusBytes("VmRSS");
  int64_t peak = before;
  for (size_t b = 0; b < order.size(); b += kBatch) {
    std::vector<int64_t> batch(order.begin() + b, order.begin() + b + kBatch);
    auto got = source->Gather(batch);
    ASSERT_TRUE(got.ok()) << got.status();
    for (int64_t i = 0; i < kBatch; i += 17) {
      ASSERT_EQ(got->first.data<float>()[i * kD + kD - 1], batch[i]);
    }
    if (b % (64 * kBatch) == 0) {
      peak = std::max(peak, ProcStatusBytes("VmRSS"));
    }
  }
  const int64_t after = ProcStatusBytes("VmRSS");
  peak = std::max(peak, after);
  ::testing::Test::RecordProperty(prefix + "rss_growth_kib",
                                  static_cast<int>((peak - before) >> 10));
  EXPECT_LT(after - before, int64_t{32} << 20)
      << "VmRSS " << (before >> 20) << " MiB -> " << (after >> 20)
      << " MiB (RssFile now " << (ProcStatusBytes("RssFile") >> 20) << " MiB)";
  EXPECT_LT(peak - before, int64_t{32} << 20)
      << "VmRSS peaked at " << (peak >> 20) << " MiB";
}

TEST(NpyShardsTest, ResidentSetStaysAboutOneBatch) {
  ExpectResidentSetStaysAboutOneBatch("rss_", 4, 65536);  // 64 MiB files
}

// Small files are cached in smaller folios, mapped page by page together
// with their neighbours (fault-around), not as one 2 MiB mapping.
TEST(NpyShardsTest, ResidentSetStaysAboutOneBatchWithSmallShards) {
  ExpectResidentSetStaysAboutOneBatch("rss_small_", 256, 1024);  // 1 MiB
}

}  // namespace
}  // namespace trainyard
