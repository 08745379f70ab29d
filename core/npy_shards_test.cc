#include "core/npy_shards.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/file_util.h"
#include "core/host_info.h"
#include "core/npy.h"
#include "core/npy_shards_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using testing::ExpectGatherMatches;
using testing::Features;
using testing::Files;
using ::testing::HasSubstr;
using testing::MakeShards;
using testing::MustOpen;
using testing::RowBytes;
using testing::Shuffled;
using testing::Targets;
using testing::TmpPath;
using testing::WithTargets;
using testing::Write;
using testing::WriteRaw;

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
