#include "cli/shard_writer.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/shard_inspect.h"
#include "core/bfloat16.h"
#include "core/file_util.h"
#include "core/npy.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

std::string NewDir(const std::string& name) {
  return JoinPath(::testing::TempDir(), name);
}

ShardLayout ClassLayout(int64_t shard_rows) {
  ShardLayout layout;
  layout.shard_rows = shard_rows;
  layout.features = 2;
  layout.target_dtype = DType::kInt64;
  return layout;
}

TEST(ShardWriterTest, SplitsRowsIntoPairsNumpyCanRead) {
  const std::string dir = NewDir("split");
  auto writer = ShardWriter::Create(dir, ClassLayout(3));
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int i = 0; i < 7; ++i) {
    x.push_back(i);
    x.push_back(0.5f * i);
    y.push_back(10 + i);
  }
  ASSERT_TRUE((*writer)->Append(x.data(), y.data(), 2).ok());
  ASSERT_TRUE((*writer)->Append(x.data() + 4, y.data() + 2, 5).ok());
  auto pairs = (*writer)->Finish();
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  ASSERT_EQ(pairs->size(), 3u);
  EXPECT_EQ((*pairs)[2].features_file, "x-00002.npy");
  EXPECT_EQ((*pairs)[2].rows, 1);
  int row = 0;
  ShardInspector inspector;
  for (const ShardPair& pair : *pairs) {
    auto xs = ReadNpy(JoinPath(dir, pair.features_file));
    auto ys = ReadNpy(JoinPath(dir, pair.targets_file));
    ASSERT_TRUE(xs.ok() && ys.ok());
    EXPECT_EQ(xs->shape(), (Shape{pair.rows, 2}));
    EXPECT_EQ(ys->shape(), (Shape{pair.rows}));
    for (int64_t r = 0; r < pair.rows; ++r, ++row) {
      EXPECT_EQ(xs->data<float>()[2 * r + 1], 0.5f * row);
      EXPECT_EQ(ys->data<int64_t>()[r], 10 + row);
    }
    // shards.json lists the same rows and digests.
    auto info = inspector.Inspect(JoinPath(dir, pair.features_file),
                                  JoinPath(dir, pair.targets_file));
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->features.sha256, pair.features_sha256);
  }
  EXPECT_EQ(row, 7);
  EXPECT_TRUE(std::filesystem::exists(JoinPath(dir, "shards.json")));
}

TEST(ShardWriterTest, FloatTargetsAreTwoDimensional) {
  const std::string dir = NewDir("float_targets");
  ShardLayout layout = ClassLayout(4);
  layout.target_dtype = DType::kFloat32;
  layout.target_width = 3;
  auto writer = ShardWriter::Create(dir, layout);
  ASSERT_TRUE(writer.ok());
  const std::vector<float> x = {1, 2}, y = {3, 4, 5};
  ASSERT_TRUE((*writer)->Append(x.data(), y.data(), 1).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  auto ys = ReadNpy(JoinPath(dir, "y-00000.npy"));
  ASSERT_TRUE(ys.ok());
  EXPECT_EQ(ys->shape(), (Shape{1, 3}));
  EXPECT_EQ(ys->data<float>()[2], 5.0f);
}

// Half-width features: each float32 rounded to nearest even, written as
// '<f2' or '<u2' words; a finite value past the range becomes infinity and
// is counted; shards.json names the dtype; inspect reads them when told.
TEST(ShardWriterTest, HalfWidthFeaturesAreRoundedWords) {
  const std::vector<float> x = {1.0f,    0.1f,    -2.5f,          1e-8f,
                                70000.f, 3.4e38f, 1.0f + 0x1p-9f, -0.0f};
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const bool bf16 = dtype == DType::kBFloat16;
    const std::string dir = NewDir(absl::StrCat("half_", DTypeName(dtype)));
    ShardLayout layout = ClassLayout(3);
    layout.features_dtype = dtype;
    auto writer = ShardWriter::Create(dir, layout);
    ASSERT_TRUE(writer.ok()) << writer.status();
    const std::vector<int64_t> y = {0, 1, 2, 3};
    ASSERT_TRUE((*writer)->Append(x.data(), y.data(), 4).ok());
    auto pairs = (*writer)->Finish();
    ASSERT_TRUE(pairs.ok()) << pairs.status();
    ASSERT_EQ(pairs->size(), 2u);
    // 70000 overflows float16 only; 3.4e38 both (bfloat16 rounds it up).
    EXPECT_EQ((*pairs)[0].overflowed, bf16 ? 1 : 2);
    EXPECT_EQ((*pairs)[1].overflowed, 0);
    std::vector<uint16_t> words;
    for (const ShardPair& pair : *pairs) {
      const std::string path = JoinPath(dir, pair.features_file);
      NpyReadOptions options;
      options.float16 = options.bfloat16_words = true;
      auto header = ReadNpyHeader(path, options);
      ASSERT_TRUE(header.ok()) << header.status();
      EXPECT_EQ(header->descr, bf16 ? "<u2" : "<f2");
      EXPECT_EQ(header->shape, (Shape{pair.rows, 2}));
      EXPECT_EQ(header->data_offset, 128u);
      auto bytes = ReadFileToString(path);
      ASSERT_TRUE(bytes.ok());
      for (size_t i = header->data_offset; i < bytes->size(); i += 2) {
        uint16_t w;
        std::memcpy(&w, bytes->data() + i, 2);
        words.push_back(w);
      }
    }
    ASSERT_EQ(words.size(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(words[i], bf16 ? FloatToBf16(x[i]) : FloatToFloat16(x[i])) << i;
    }
    EXPECT_EQ(words[6], bf16 ? 0x3F80 : 0x3C02);  // 1 + 2^-9 at each width
    auto json = ReadFileToString(JoinPath(dir, "shards.json"));
    ASSERT_TRUE(json.ok());
    EXPECT_NE(json->find(absl::StrCat("\"dtype\": \"", DTypeName(dtype), "\"")),
              std::string::npos)
        << *json;
    ShardInspector inspector(dtype);
    auto info = inspector.Inspect(JoinPath(dir, "x-00000.npy"),
                                  JoinPath(dir, "y-00000.npy"));
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->features.dtype, dtype);
  }
}

TEST(ShardWriterTest, RefusesOtherFeatureDTypes) {
  ShardLayout layout = ClassLayout(3);
  layout.features_dtype = DType::kInt32;
  auto writer = ShardWriter::Create(NewDir("int_features"), layout);
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.status().message(),
            "features are stored as float32, float16 or bfloat16, not int32");
}

TEST(ShardWriterTest, RefusesNonEmptyFolder) {
  const std::string dir = NewDir("not_empty");
  ASSERT_TRUE(CreateDirectories(dir).ok());
  ASSERT_TRUE(WriteFileAtomically(JoinPath(dir, "a.txt"), "x").ok());
  auto writer = ShardWriter::Create(dir, ClassLayout(3));
  ASSERT_EQ(writer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(writer.status().message().find(dir + ": exists and is not empty"),
            std::string::npos)
      << writer.status();
}

TEST(ShardWriterTest, UnfinishedWriterLeavesNothing) {
  const std::string dir = NewDir("unfinished");
  {
    auto writer = ShardWriter::Create(dir, ClassLayout(2));
    ASSERT_TRUE(writer.ok());
    const std::vector<float> x(10, 1.0f);
    const std::vector<int64_t> y(5, 1);
    ASSERT_TRUE((*writer)->Append(x.data(), y.data(), 5).ok());
    EXPECT_TRUE(std::filesystem::exists(JoinPath(dir, "x-00001.npy")));
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(ShardWriterTest, NamesGrowPastFiveDigits) {
  EXPECT_EQ(ShardFileName('y', 7), "y-00007.npy");
  EXPECT_EQ(ShardFileName('x', 123456), "x-123456.npy");
}

}  // namespace
}  // namespace trainyard
