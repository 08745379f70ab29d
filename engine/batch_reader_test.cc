#include "engine/batch_reader.h"

#include <sys/stat.h>
#include <sys/time.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/file_util.h"
#include "core/npy.h"
#include "engine/dataset.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kRowsPerShard = 10;
constexpr int64_t kShards = 3;
constexpr int64_t kD = 4;

std::string TmpPath(const std::string& name) {
  return JoinPath(::testing::TempDir(), name);
}

// Shard k: features row r (of the source) column j = r * 100 + j, targets
// r, so a row's values say which row it is.
struct Shards {
  std::vector<std::string> features, targets;
};

Shards WriteShards(const std::string& prefix) {
  Shards s;
  for (int64_t k = 0; k < kShards; ++k) {
    Tensor x = Tensor::Empty(DType::kFloat32, {kRowsPerShard, kD});
    Tensor y = Tensor::Empty(DType::kInt64, {kRowsPerShard});
    for (int64_t i = 0; i < kRowsPerShard; ++i) {
      const int64_t r = k * kRowsPerShard + i;
      for (int64_t j = 0; j < kD; ++j)
        x.data<float>()[i * kD + j] = r * 100 + j;
      y.data<int64_t>()[i] = r;
    }
    s.features.push_back(TmpPath(absl::StrCat(prefix, "x-", k, ".npy")));
    s.targets.push_back(TmpPath(absl::StrCat(prefix, "y-", k, ".npy")));
    EXPECT_TRUE(WriteNpy(s.features.back(), x).ok());
    EXPECT_TRUE(WriteNpy(s.targets.back(), y).ok());
  }
  return s;
}

BatchReader::Options ReaderOptions(int64_t batch, bool shuffle) {
  BatchReader::Options o;
  o.batch_size = batch;
  o.shuffle = shuffle;
  o.seed = 7;
  o.slice_begin = 0;
  o.slice_end = batch;
  o.allocate = [](DType dtype, Shape shape) {
    return Tensor::Create(dtype, std::move(shape));
  };
  return o;
}

std::vector<int64_t> TargetsOf(const BatchReader::Batch& b) {
  const int64_t* p = b.targets.data<int64_t>();
  return std::vector<int64_t>(p, p + b.targets.dim(0));
}

TEST(BatchReaderTest, YieldsTheSamplersRowsInOrderAndAfterAJump) {
  const Shards s = WriteShards("order-");
  auto source = NpyShards::Open(s.features, s.targets);
  ASSERT_TRUE(source.ok()) << source.status();
  BatchReader::Options o = ReaderOptions(8, /*shuffle=*/true);
  o.slice_begin = 2;  // a replica's part: rows 2..5 of each batch
  o.slice_end = 6;
  auto reader = BatchReader::Create(*source, o);
  ASSERT_TRUE(reader.ok()) << reader.status();
  BatchSampler sampler(kShards * kRowsPerShard, 8, true, 7);
  for (int step = 0; step < 12; ++step) {  // several epochs
    if (step == 7) sampler.Seek(3);        // a restore: not a batch boundary
    const int64_t position = sampler.position();
    const std::vector<int64_t> rows = sampler.Next();
    auto batch = (*reader)->Take(position);
    ASSERT_TRUE(batch.ok()) << batch.status();
    const std::vector<int64_t> want(rows.begin() + 2, rows.begin() + 6);
    EXPECT_EQ(TargetsOf(*batch), want) << "step " << step;
    ASSERT_EQ(batch->features.dtype(), DType::kFloat32);
    ASSERT_EQ(batch->features.shape(), (Shape{4, kD}));
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(batch->features.data<float>()[i * kD + 3], want[i] * 100 + 3);
    }
  }
}

// A shard rewritten after the reader opened it: the batches read before
// are the old rows (still correct), the batch that needs the changed file
// fails with DataLoss naming it, never with other rows.
TEST(BatchReaderTest, AChangedShardFailsTheBatchThatNeedsIt) {
  const Shards s = WriteShards("changed-");
  auto source = NpyShards::Open(s.features, s.targets);
  ASSERT_TRUE(source.ok()) << source.status();
  auto reader = BatchReader::Create(*source, ReaderOptions(5, false));
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->Take(0).ok());
  // Rewrite shard 2 (rows 20..29) with other values and another mtime.
  Tensor other = Tensor::Zeros(DType::kFloat32, {kRowsPerShard, kD});
  ASSERT_TRUE(WriteNpy(s.features[2], other).ok());
  struct timeval times[2] = {{1000000000, 0}, {1000000000, 0}};
  ASSERT_EQ(::utimes(s.features[2].c_str(), times), 0);
  for (int64_t position = 5; position < 20; position += 5) {
    auto batch = (*reader)->Take(position);
    ASSERT_TRUE(batch.ok()) << position << ": " << batch.status();
    EXPECT_EQ(TargetsOf(*batch)[0], position);
  }
  auto failed = (*reader)->Take(20);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(failed.status().message(), HasSubstr(s.features[2]));
  // Later batches fail too; the rows before it can be read again.
  EXPECT_FALSE((*reader)->Take(25).ok());
  auto again = (*reader)->Take(10);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(TargetsOf(*again)[0], 10);
}

// Half-width features stay as stored (for widening on the device), or
// are widened to float32 on the host.
TEST(BatchReaderTest, KeepsHalfWidthFeaturesAsStoredOrWidensThem) {
  // One float16 shard: the header of a float32 one with '<f4' -> '<f2'.
  Tensor half_words = Tensor::Empty(DType::kUInt8, {kRowsPerShard * kD * 2});
  uint16_t* w = reinterpret_cast<uint16_t*>(half_words.raw_data());
  for (int64_t i = 0; i < kRowsPerShard * kD; ++i) {
    w[i] = static_cast<uint16_t>(0x3C00 + i);  // 1.0 and up, exact
  }
  auto header = NpyHeaderBytes(DType::kFloat32, {kRowsPerShard, kD});
  ASSERT_TRUE(header.ok());
  const std::string half_header =
      absl::StrReplaceAll(*header, {{"<f4", "<f2"}});
  const std::string features = TmpPath("half-x.npy");
  ASSERT_TRUE(
      WriteFileAtomically(
          features,
          half_header + std::string(static_cast<char*>(half_words.raw_data()),
                                    kRowsPerShard * kD * 2))
          .ok());
  const Shards s = WriteShards("half-");
  auto source = NpyShards::Open({features}, {s.targets[0]});
  ASSERT_TRUE(source.ok()) << source.status();
  for (bool stored : {true, false}) {
    BatchReader::Options o = ReaderOptions(3, false);
    o.stored_width = stored;
    auto reader = BatchReader::Create(*source, o);
    ASSERT_TRUE(reader.ok()) << reader.status();
    auto batch = (*reader)->Take(3);  // rows 3, 4, 5
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_EQ(batch->features.dtype(),
              stored ? DType::kFloat16 : DType::kFloat32);
    for (int64_t e = 0; e < 3 * kD; ++e) {
      const uint16_t word = w[3 * kD + e];
      if (stored) {
        uint16_t got;
        std::memcpy(&got,
                    static_cast<const char*>(batch->features.ptr()) + 2 * e, 2);
        EXPECT_EQ(got, word);
      } else {
        EXPECT_EQ(batch->features.data<float>()[e], Float16ToFloat(word));
      }
    }
  }
}

TEST(BatchReaderTest, RefusesOptionsOutOfRange) {
  const Shards s = WriteShards("bad-");
  auto source = NpyShards::Open(s.features, s.targets);
  ASSERT_TRUE(source.ok()) << source.status();
  BatchReader::Options o = ReaderOptions(4, false);
  o.slice_end = 5;  // past the batch
  auto reader = BatchReader::Create(*source, o);
  ASSERT_FALSE(reader.ok());
  EXPECT_THAT(reader.status().message(), HasSubstr("rows [0, 5)"));
}

}  // namespace
}  // namespace trainyard
