#include "engine/output_shards.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/file_util.h"
#include "core/host_info.h"
#include "core/npy.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh, empty-to-be folder path under TEST_TMPDIR (not created).
std::string FreshDir(const std::string& name) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = JoinPath(tmp != nullptr ? tmp : "/tmp",
                             absl::StrCat(name, "-", counter++));
  fs::remove_all(dir);
  return dir;
}

OutputJob MakeJob(const std::string& dir, int64_t rows, int64_t shard_rows,
                  const std::string& digest = "9f8e") {
  OutputJob job;
  job.dir = dir;
  job.rows = rows;
  job.shard_rows = shard_rows;
  job.job_digest = digest;
  job.model_json = R"({"checkpoint_step": 7})";
  job.spec_json = R"({"task": "digits"})";
  return job;
}

// The outputs of rows [row, row + n): "probabilities" float32 [n, 3] and
// "predicted_class" int64 [n], distinct per row and column.
NamedTensors RowsOf(int64_t row, int64_t n) {
  Tensor probs = Tensor::Empty(DType::kFloat32, {n, 3});
  Tensor cls = Tensor::Empty(DType::kInt64, {n});
  for (int64_t i = 0; i < n; ++i) {
    for (int c = 0; c < 3; ++c) {
      probs.data<float>()[i * 3 + c] = (row + i) * 10.0f + c + 0.25f;
    }
    cls.data<int64_t>()[i] = (row + i) * 7 - 3;
  }
  return {{"probabilities", probs}, {"predicted_class", cls}};
}

std::string ShardFile(const std::string& dir, int64_t shard,
                      const std::string& name) {
  return JoinPath(dir, absl::StrFormat("shard-%05d/%s.npy", shard, name));
}

// Every shard file holds exactly rows [begin, end) of RowsOf.
void ExpectShardFiles(const std::string& dir, int64_t rows,
                      int64_t shard_rows) {
  for (int64_t begin = 0, k = 0; begin < rows; begin += shard_rows, ++k) {
    const int64_t end = std::min(begin + shard_rows, rows);
    for (const auto& [name, want] : RowsOf(begin, end - begin)) {
      absl::StatusOr<Tensor> got = ReadNpy(ShardFile(dir, k, name));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->dtype(), want.dtype()) << name << " shard " << k;
      EXPECT_EQ(got->shape(), want.shape()) << name << " shard " << k;
      ASSERT_EQ(got->nbytes(), want.nbytes());
      EXPECT_EQ(std::memcmp(got->raw_data(), want.raw_data(), want.nbytes()), 0)
          << name << " shard " << k;
    }
  }
}

// The bytes of every file under `dir` except manifest.json, by relative
// path.
std::map<std::string, std::string> FilesUnder(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string rel = fs::relative(entry.path(), dir).string();
    if (rel == "manifest.json") continue;
    files[rel] = ReadFileToString(entry.path().string()).value();
  }
  return files;
}

std::unique_ptr<OutputShards> OpenOrDie(const OutputJob& job) {
  auto out = OutputShards::Open(job);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *std::move(out) : nullptr;
}

// A fresh folder and an OutputShards opened on it for N rows in shards of
// S (null after a test failure).
struct Opened {
  std::string dir;
  std::unique_ptr<OutputShards> out;
};
Opened OpenFresh(const std::string& name, int64_t rows = 10,
                 int64_t shard_rows = 4) {
  Opened opened;
  opened.dir = FreshDir(name);
  opened.out = OpenOrDie(MakeJob(opened.dir, rows, shard_rows));
  return opened;
}

// Writes a whole job by chunks of `chunk` rows, in order.
void WriteAll(const OutputJob& job, int64_t chunk) {
  auto out = OpenOrDie(job);
  ASSERT_NE(out, nullptr);
  for (int64_t k = 0; k < out->num_shards(); ++k) {
    const auto [begin, end] = out->ShardRows(k);
    for (int64_t r = begin; r < end; r += chunk) {
      ASSERT_TRUE(out->Add(r, RowsOf(r, std::min(chunk, end - r))).ok());
    }
  }
  ASSERT_TRUE(out->Finish().ok());
}

nlohmann::json ReadManifest(const std::string& dir) {
  return nlohmann::json::parse(
      ReadFileToString(JoinPath(dir, "manifest.json")).value());
}

// A pid that is certainly not running: a child that has exited and been
// reaped.
pid_t DeadPid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

TEST(OutputShardsTest, RowsInOrderWriteEachShard) {
  auto [dir, out] = OpenFresh("in-order");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->num_shards(), 3);
  EXPECT_EQ(out->ShardRows(2), std::make_pair(int64_t{8}, int64_t{10}));
  for (int64_t r = 0; r < 10; r += 2) {
    ASSERT_TRUE(out->Add(r, RowsOf(r, 2)).ok());
  }
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(out->done(k)) << k;
  ExpectShardFiles(dir, 10, 4);
}

TEST(OutputShardsTest, ShardAppearsOnlyWhenAllItsRowsAreIn) {
  auto [dir, out] = OpenFresh("appears");
  ASSERT_NE(out, nullptr);
  ASSERT_TRUE(out->Add(0, RowsOf(0, 3)).ok());
  EXPECT_FALSE(fs::exists(JoinPath(dir, "shard-00000")));
  EXPECT_FALSE(out->done(0));
  ASSERT_TRUE(out->Add(3, RowsOf(3, 1)).ok());
  EXPECT_TRUE(fs::is_directory(JoinPath(dir, "shard-00000")));
  EXPECT_TRUE(out->done(0));
}

TEST(OutputShardsTest, RowsOutOfOrderWriteTheSameFiles) {
  const std::string in_order = FreshDir("ref");
  WriteAll(MakeJob(in_order, 10, 4), 4);
  auto [dir, out] = OpenFresh("shuffled");
  ASSERT_NE(out, nullptr);
  std::vector<int64_t> rows = {9, 2, 5, 0, 8, 7, 1, 3, 6, 4};
  for (int64_t r : rows) ASSERT_TRUE(out->Add(r, RowsOf(r, 1)).ok()) << r;
  ASSERT_TRUE(out->Finish().ok());
  ExpectShardFiles(dir, 10, 4);
  EXPECT_EQ(FilesUnder(dir), FilesUnder(in_order));
}

TEST(OutputShardsTest, ThreadsAddConcurrently) {
  const std::string dir = FreshDir("threads");
  const int64_t kRows = 1003, kShardRows = 35, kChunk = 5;
  auto out = OpenOrDie(MakeJob(dir, kRows, kShardRows));
  ASSERT_NE(out, nullptr);
  std::atomic<int64_t> next{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int64_t r; (r = next.fetch_add(kChunk)) < kRows;) {
        const int64_t end =
            std::min(r + kChunk, out->ShardRows(r / kShardRows).second);
        if (!out->Add(r, RowsOf(r, end - r)).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int64_t k = 0; k < out->num_shards(); ++k) EXPECT_TRUE(out->done(k));
  ASSERT_TRUE(out->Finish().ok());
  ExpectShardFiles(dir, kRows, kShardRows);
}

TEST(OutputShardsTest, ResumeKeepsCompleteShardsAndWritesTheRest) {
  const std::string whole = FreshDir("uninterrupted");
  WriteAll(MakeJob(whole, 10, 4), 1);
  const std::string dir = FreshDir("crashed");
  {
    auto first = OpenOrDie(MakeJob(dir, 10, 4));
    ASSERT_NE(first, nullptr);
    ASSERT_TRUE(first->Add(0, RowsOf(0, 4)).ok());
    ASSERT_TRUE(first->Add(4, RowsOf(4, 2)).ok());
  }  // dropped mid-shard 1: a crash
  EXPECT_TRUE(fs::is_directory(JoinPath(dir, "shard-00000")));
  EXPECT_FALSE(fs::exists(JoinPath(dir, "shard-00001")));
  struct stat before;
  ASSERT_EQ(::stat(ShardFile(dir, 0, "probabilities").c_str(), &before), 0);

  auto again = OpenOrDie(MakeJob(dir, 10, 4));
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(again->done(0));
  EXPECT_FALSE(again->done(1));
  EXPECT_FALSE(again->done(2));
  EXPECT_EQ(ReadManifest(dir)["complete"], false);
  for (int64_t r = 4; r < 10; ++r)
    ASSERT_TRUE(again->Add(r, RowsOf(r, 1)).ok());
  ASSERT_TRUE(again->Finish().ok());

  struct stat after;
  ASSERT_EQ(::stat(ShardFile(dir, 0, "probabilities").c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);  // shard 0 never rewritten
  EXPECT_EQ(FilesUnder(dir), FilesUnder(whole));
  EXPECT_EQ(ReadManifest(dir), ReadManifest(whole));
}

TEST(OutputShardsTest, RowsOfADoneShardAreRefused) {
  const std::string dir = FreshDir("done-refused");
  { WriteAll(MakeJob(dir, 10, 4), 4); }
  auto again = OpenOrDie(MakeJob(dir, 10, 4));
  ASSERT_NE(again, nullptr);
  absl::Status s = again->Add(4, RowsOf(4, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rows [4, 5) of shard 1 were given twice: "
                                     "the shard is already complete on disk"));
}

TEST(OutputShardsTest, LeftoverTempFoldersOfDeadProcessesAreRemoved) {
  const std::string dir = FreshDir("leftovers");
  { ASSERT_NE(OpenOrDie(MakeJob(dir, 10, 4)), nullptr); }
  const std::string host = Hostname();
  const std::string dead =
      JoinPath(dir, absl::StrCat(".shard-00001.tmp-", DeadPid(), "-ab-", host));
  const std::string live = JoinPath(
      dir, absl::StrCat(".shard-00002.tmp-", ::getpid(), "-cd-", host));
  const std::string elsewhere = JoinPath(
      dir, absl::StrCat(".shard-00002.tmp-", DeadPid(), "-ef-other.example"));
  for (const std::string& d : {dead, live, elsewhere}) {
    ASSERT_TRUE(CreateDirectories(d).ok());
    ASSERT_TRUE(
        WriteFileAtomically(JoinPath(d, "probabilities.npy"), "x").ok());
  }
  auto out = OpenOrDie(MakeJob(dir, 10, 4));
  ASSERT_NE(out, nullptr);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));       // a writer of this host at work
  EXPECT_TRUE(fs::exists(elsewhere));  // another host: cannot tell
  for (int64_t r = 0; r < 10; r += 2)
    ASSERT_TRUE(out->Add(r, RowsOf(r, 2)).ok());
  ASSERT_TRUE(out->Finish().ok());  // every shard written: none in use
  EXPECT_FALSE(fs::exists(live));
  EXPECT_FALSE(fs::exists(elsewhere));
}

TEST(OutputShardsTest, FolderWithAForeignFileIsRefusedUntouched) {
  const std::string dir = FreshDir("foreign");
  ASSERT_TRUE(CreateDirectories(dir).ok());
  ASSERT_TRUE(WriteFileAtomically(JoinPath(dir, "a.txt"), "hello").ok());
  auto out = OutputShards::Open(MakeJob(dir, 10, 4));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(out.status().message(),
            absl::StrCat("inference.output_dir: ", dir,
                         " exists and is not an earlier run of this job (it "
                         "holds \"a.txt\")"));
  EXPECT_FALSE(fs::exists(JoinPath(dir, "manifest.json")));
  EXPECT_EQ(ReadFileToString(JoinPath(dir, "a.txt")).value(), "hello");
}

TEST(OutputShardsTest, FolderOfAnotherJobIsRefused) {
  const std::string dir = FreshDir("other-digest");
  ASSERT_NE(OpenOrDie(MakeJob(dir, 10, 4, "1a2b")), nullptr);
  const std::string manifest =
      ReadFileToString(JoinPath(dir, "manifest.json")).value();
  auto out = OutputShards::Open(MakeJob(dir, 10, 4, "9f8e"));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(out.status().message(),
            absl::StrCat("inference.output_dir: ", dir,
                         " holds the outputs of another job (job digest "
                         "1a2b, this job 9f8e)"));
  EXPECT_EQ(ReadFileToString(JoinPath(dir, "manifest.json")).value(), manifest);
}

TEST(OutputShardsTest, SameJobCutOtherwiseIsRefused) {
  const std::string dir = FreshDir("other-cut");
  ASSERT_NE(OpenOrDie(MakeJob(dir, 10, 4)), nullptr);
  auto rows = OutputShards::Open(MakeJob(dir, 12, 4));
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(rows.status().message(),
              HasSubstr(" holds outputs of this job cut as rows 10, "
                        "shard_rows 4; this run has rows 12, shard_rows 4"));
  auto shard_rows = OutputShards::Open(MakeJob(dir, 10, 5));
  EXPECT_EQ(shard_rows.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(shard_rows.status().message(),
              HasSubstr("this run has rows 10, shard_rows 5"));
}

TEST(OutputShardsTest, ManifestOfAnotherFormatIsRefused) {
  const std::string dir = FreshDir("other-format");
  ASSERT_TRUE(CreateDirectories(dir).ok());
  ASSERT_TRUE(WriteFileAtomically(JoinPath(dir, "manifest.json"),
                                  R"({"format": "trainyard.checkpoint.v1"})")
                  .ok());
  auto out = OutputShards::Open(MakeJob(dir, 10, 4));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out.status().message(),
              HasSubstr("exists and is not an earlier run of this job (its "
                        "manifest.json is not trainyard-outputs-v1)"));
}

TEST(OutputShardsTest, BadJobsAreInvalidArguments) {
  const std::string dir = FreshDir("bad-job");
  OutputJob relative = MakeJob("out", 10, 4);
  OutputJob negative = MakeJob(dir, -1, 4);
  OutputJob zero_shard = MakeJob(dir, 10, 0);
  OutputJob no_digest = MakeJob(dir, 10, 4, "");
  OutputJob bad_model = MakeJob(dir, 10, 4);
  bad_model.model_json = "[1, 2]";
  const std::pair<OutputJob, std::string> cases[] = {
      {relative, "dir must be an absolute path, got \"out\""},
      {negative, "rows must be >= 0, got -1"},
      {zero_shard, "shard_rows must be >= 1, got 0"},
      {no_digest, "job_digest must not be empty"},
      {bad_model, "model_json must be a JSON object, got: [1, 2]"},
  };
  for (const auto& [job, message] : cases) {
    auto out = OutputShards::Open(job);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(out.status().message(), HasSubstr(message));
  }
  EXPECT_FALSE(fs::exists(dir));
}

TEST(OutputShardsTest, BadRowsAreRefused) {
  auto [dir, out] = OpenFresh("bad-rows");
  ASSERT_NE(out, nullptr);
  const std::pair<int64_t, std::string> cases[] = {
      {-1, "rows [-1, 1) are out of range: the job has 10 rows"},
      {9, "rows [9, 11) are out of range: the job has 10 rows"},
      {3, "rows [3, 5) cross the end of shard 0 (rows [0, 4))"},
  };
  for (const auto& [row, message] : cases) {
    absl::Status s = out->Add(row, RowsOf(row, 2));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << row;
    EXPECT_THAT(s.message(), HasSubstr(message));
  }
}

TEST(OutputShardsTest, RowsGivenTwiceAreRefused) {
  auto [dir, out] = OpenFresh("twice");
  ASSERT_NE(out, nullptr);
  ASSERT_TRUE(out->Add(4, RowsOf(4, 2)).ok());
  absl::Status pending = out->Add(5, RowsOf(5, 1));
  EXPECT_EQ(pending.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pending.message(),
              HasSubstr("rows [5, 6) of shard 1 were given twice: row 5 is "
                        "already in"));
  ASSERT_TRUE(out->Add(0, RowsOf(0, 4)).ok());
  absl::Status written = out->Add(0, RowsOf(0, 1));
  EXPECT_EQ(written.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(written.message(), HasSubstr("rows [0, 1) of shard 0 were "
                                           "given twice"));
  // The refused rows changed nothing: the rest of shard 1 completes it.
  ASSERT_TRUE(out->Add(6, RowsOf(6, 2)).ok());
  EXPECT_TRUE(out->done(1));
}

TEST(OutputShardsTest, OutputsUnlikeEarlierCallsAreRefused) {
  auto [dir, out] = OpenFresh("mismatch");
  ASSERT_NE(out, nullptr);
  ASSERT_TRUE(out->Add(0, RowsOf(0, 1)).ok());

  struct Case {
    int64_t rows;                               // of RowsOf(1, rows)
    std::function<void(NamedTensors*)> change;  // made to them
    std::string message;
  };
  const Case cases[] = {
      {1,
       [](NamedTensors* o) {
         (*o)[0].second = Tensor::Zeros(DType::kFloat32, {1, 4});
       },
       "output \"probabilities\" is float32 [1, 4], earlier rows had "
       "float32 [n, 3]"},
      {1,
       [](NamedTensors* o) {
         (*o)[1].second = Tensor::Zeros(DType::kInt32, {1});
       },
       "output \"predicted_class\" is int32 [1], earlier rows had int64 [n]"},
      {1, [](NamedTensors* o) { (*o)[1].first = "label"; },
       "outputs {label, probabilities} differ from earlier rows' "
       "{predicted_class, probabilities}"},
      {2,
       [](NamedTensors* o) {
         (*o)[1].second = Tensor::Zeros(DType::kInt64, {1});
       },
       "output \"predicted_class\" has 1 rows, \"probabilities\" has 2"},
      {1, [](NamedTensors* o) { o->clear(); }, "no outputs given"},
      {1, [](NamedTensors* o) { (*o)[0].first = "../x"; },
       "output name \"../x\" is not a safe file name"},
  };
  for (const Case& c : cases) {
    NamedTensors outputs = RowsOf(1, c.rows);
    c.change(&outputs);
    absl::Status s = out->Add(1, outputs);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
  // Outputs in another order are the same outputs.
  NamedTensors reordered = RowsOf(1, 3);
  std::swap(reordered[0], reordered[1]);
  ASSERT_TRUE(out->Add(1, reordered).ok());
  ExpectShardFiles(dir, 4, 4);
}

TEST(OutputShardsTest, FinishNamesTheFirstMissingShard) {
  auto [dir, out] = OpenFresh("missing");
  ASSERT_NE(out, nullptr);
  ASSERT_TRUE(out->Add(0, RowsOf(0, 4)).ok());
  ASSERT_TRUE(out->Add(8, RowsOf(8, 2)).ok());
  absl::Status s = out->Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat(dir,
                                     "/shard-00001 (rows [4, 8)) is "
                                     "missing")));
  EXPECT_EQ(ReadManifest(dir)["complete"], false);
}

TEST(OutputShardsTest, FinishWritesTheWholeManifest) {
  const std::string dir = FreshDir("manifest");
  WriteAll(MakeJob(dir, 10, 4), 3);
  const std::string text =
      ReadFileToString(JoinPath(dir, "manifest.json")).value();
  nlohmann::ordered_json m = nlohmann::ordered_json::parse(text);
  std::vector<std::string> keys;
  for (const auto& item : m.items()) keys.push_back(item.key());
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "format", "complete", "job_digest", "rows", "shard_rows",
                      "num_shards", "model", "spec", "outputs", "shards"}));
  EXPECT_EQ(m["format"], "trainyard-outputs-v1");
  EXPECT_EQ(m["complete"], true);
  EXPECT_EQ(m["job_digest"], "9f8e");
  EXPECT_EQ(m["rows"], 10);
  EXPECT_EQ(m["shard_rows"], 4);
  EXPECT_EQ(m["num_shards"], 3);
  EXPECT_EQ(m["model"],
            nlohmann::ordered_json::parse(R"({"checkpoint_step": 7})"));
  EXPECT_EQ(m["spec"], nlohmann::ordered_json::parse(R"({"task": "digits"})"));
  EXPECT_EQ(m["outputs"], nlohmann::ordered_json::parse(R"({
      "predicted_class": {"dtype": "<i8", "shape": [10]},
      "probabilities": {"dtype": "<f4", "shape": [10, 3]}})"));
  ASSERT_EQ(m["shards"].size(), 3);
  EXPECT_EQ(m["shards"][2], nlohmann::ordered_json::parse(R"({
      "index": 2, "rows": [8, 10],
      "files": {"predicted_class": "shard-00002/predicted_class.npy",
                "probabilities": "shard-00002/probabilities.npy"}})"));
  EXPECT_EQ(m["shards"][0]["rows"], nlohmann::ordered_json::parse("[0, 4]"));
  // 2-space indent, and Finish again writes the same bytes.
  EXPECT_THAT(text, HasSubstr("\n  \"format\": \"trainyard-outputs-v1\",\n"));
  auto again = OpenOrDie(MakeJob(dir, 10, 4));
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(again->Finish().ok());
  EXPECT_EQ(ReadFileToString(JoinPath(dir, "manifest.json")).value(), text);
}

TEST(OutputShardsTest, FinishRefusesShardsThatDisagree) {
  const std::string dir = FreshDir("disagree");
  // Two writers of one folder (two processes) that disagree on a shape.
  auto a = OpenOrDie(MakeJob(dir, 8, 4));
  auto b = OpenOrDie(MakeJob(dir, 8, 4));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->Add(0, RowsOf(0, 4)).ok());
  NamedTensors wider = RowsOf(4, 4);
  wider[0].second = Tensor::Zeros(DType::kFloat32, {4, 5});
  ASSERT_TRUE(b->Add(4, wider).ok());
  absl::Status s = a->Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("shard-00001/probabilities.npy: float32 [n, 5] "
                        "differs from shard-00000's float32 [n, 3]"));
}

TEST(OutputShardsTest, ProcessesSharingTheFolderEachWriteTheirShards) {
  const std::string dir = FreshDir("shared");
  std::vector<std::unique_ptr<OutputShards>> writers(4);
  std::vector<std::thread> opens;
  for (auto& w : writers) {
    opens.emplace_back([&w, &dir] { w = OpenOrDie(MakeJob(dir, 50, 6)); });
  }
  for (auto& t : opens) t.join();
  for (const auto& w : writers) ASSERT_NE(w, nullptr);
  for (int64_t k = 0; k < writers[0]->num_shards(); ++k) {
    OutputShards& w = *writers[k % writers.size()];
    const auto [begin, end] = w.ShardRows(k);
    ASSERT_TRUE(w.Add(begin, RowsOf(begin, end - begin)).ok());
  }
  EXPECT_FALSE(writers[1]->done(0));  // written by another "process"
  ASSERT_TRUE(writers[1]->Finish().ok());
  ExpectShardFiles(dir, 50, 6);
  EXPECT_EQ(ReadManifest(dir)["complete"], true);
}

TEST(OutputShardsTest, ZeroRowsHaveNoShards) {
  auto [dir, out] = OpenFresh("empty-job", 0, 4);
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->num_shards(), 0);
  ASSERT_TRUE(out->Finish().ok());
  nlohmann::json m = ReadManifest(dir);
  EXPECT_EQ(m["complete"], true);
  EXPECT_EQ(m["num_shards"], 0);
  EXPECT_EQ(m["outputs"], nlohmann::json::object());
  EXPECT_EQ(m["shards"], nlohmann::json::array());
}

}  // namespace
}  // namespace trainyard
