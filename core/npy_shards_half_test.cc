// NpyShards with half-width features: float16 ('<f2') and bfloat16 words
// ('<u2', '|V2' with features_dtype bfloat16), widened exactly, gathered
// as stored, and refused where the files and the option disagree.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/bfloat16.h"
#include "core/npy_shards.h"
#include "core/npy_shards_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using testing::Files;
using testing::MakeShards;
using ::testing::HasSubstr;
using testing::MustOpen;
using testing::RowBytes;
using testing::Shuffled;
using testing::Targets;
using testing::WithTargets;
using testing::Write;
using testing::WriteRaw;

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

}  // namespace
}  // namespace trainyard
