#include "engine/checkpoint_store.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = JoinPath(tmp != nullptr ? tmp : "/tmp", name);
  EXPECT_TRUE(CreateDirectories(dir).ok());
  return dir;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// A stage file whose contents depend on (step, stage).
SafetensorsFile StageContents(int64_t step, int stage) {
  SafetensorsFile f;
  f.tensors.emplace_back(
      "blocks." + std::to_string(stage) + ".fc1.weight",
      Tensor::FromVector(
          {static_cast<float>(step), static_cast<float>(stage), 0.5f, -1.f},
          {2, 2}));
  f.metadata["step"] = std::to_string(step);
  return f;
}

void WriteCheckpoint(const std::string& dir, int64_t step, int stages) {
  for (int k = 0; k < stages; ++k) {
    ASSERT_TRUE(WriteStageFile(dir, step, k, StageContents(step, k)).ok());
  }
  ASSERT_TRUE(CommitCheckpoint(dir, step, stages, "{\"job\":\"t\"}").ok());
}

TEST(CheckpointStoreTest, LayoutAndRoundTrip) {
  std::string dir = FreshDir("roundtrip");
  auto sha = WriteStageFile(dir, 7, 0, StageContents(7, 0));
  ASSERT_TRUE(sha.ok()) << sha.status();
  EXPECT_EQ(sha->size(), 64u);
  ASSERT_TRUE(WriteStageFile(dir, 7, 1, StageContents(7, 1)).ok());
  ASSERT_TRUE(CommitCheckpoint(dir, 7, 2, "{\"name\": \"x\\n\"}").ok());

  EXPECT_TRUE(Exists(dir + "/step_00000007/stage_0.safetensors"));
  EXPECT_TRUE(Exists(dir + "/step_00000007/stage_1.safetensors"));
  EXPECT_TRUE(Exists(dir + "/step_00000007/manifest.json"));

  auto manifest = ReadCheckpointManifest(dir, 7);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step, 7);
  EXPECT_EQ(manifest->num_stages, 2);
  EXPECT_EQ(manifest->job_metadata_json, "{\"name\": \"x\\n\"}");
  ASSERT_EQ(manifest->stages.size(), 2u);
  EXPECT_EQ(manifest->stages[0].file, "stage_0.safetensors");
  EXPECT_EQ(manifest->stages[0].sha256, *sha);
  EXPECT_EQ(manifest->stages[0].size,
            *FileSize(CheckpointStagePath(dir, 7, 0)));

  auto stage1 = ReadStageFile(dir, 7, 1, 2);
  ASSERT_TRUE(stage1.ok()) << stage1.status();
  auto w = stage1->Get("blocks.1.fc1.weight");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->data<float>()[0], 7.f);
  EXPECT_EQ(w->data<float>()[1], 1.f);
  EXPECT_EQ(stage1->metadata.at("step"), "7");
}

TEST(CheckpointStoreTest, StepFolderNames) {
  EXPECT_EQ(CheckpointStepDir("/ck", 42), "/ck/step_00000042");
  EXPECT_EQ(CheckpointStepDir("/ck/", 123456789), "/ck/step_123456789");
  EXPECT_EQ(CheckpointStagePath("ck", 0, 3),
            "ck/step_00000000/stage_3.safetensors");
}

TEST(CheckpointStoreTest, ListAndLatestAscending) {
  std::string dir = FreshDir("list");
  auto none = LatestCheckpoint(dir);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  WriteCheckpoint(dir, 20, 1);
  WriteCheckpoint(dir, 3, 1);
  WriteCheckpoint(dir, 100000000, 1);  // 9 digits
  // Noise that is not a checkpoint.
  ASSERT_TRUE(CreateDirectories(dir + "/step_7").ok());  // not 8 digits
  ASSERT_TRUE(CreateDirectories(dir + "/other").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/step_00000009", "a file").ok());
  auto steps = ListCompleteCheckpoints(dir);
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_THAT(*steps, ElementsAre(3, 20, 100000000));
  EXPECT_EQ(**LatestCheckpoint(dir), 100000000);
}

TEST(CheckpointStoreTest, MissingDirHasNoCheckpoints) {
  auto steps = ListCompleteCheckpoints(FreshDir("x") + "/never_created");
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_TRUE(steps->empty());
}

TEST(CheckpointStoreTest, CrashBeforeManifestKeepsPreviousLatest) {
  std::string dir = FreshDir("crash");
  WriteCheckpoint(dir, 10, 2);
  // Step 20: both stages wrote their files, then the process died before
  // CommitCheckpoint.
  ASSERT_TRUE(WriteStageFile(dir, 20, 0, StageContents(20, 0)).ok());
  ASSERT_TRUE(WriteStageFile(dir, 20, 1, StageContents(20, 1)).ok());
  // And a half-written temp file from a third crash.
  ASSERT_TRUE(WriteFileAtomically(
                  CheckpointStagePath(dir, 20, 1) + ".tmp.999.0", "partial")
                  .ok());
  EXPECT_EQ(**LatestCheckpoint(dir), 10);
  auto read = ReadStageFile(dir, 20, 0, 2);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr("step_00000020"));
  EXPECT_THAT(read.status().message(), HasSubstr("not complete"));
  // The older one is intact.
  EXPECT_TRUE(ReadStageFile(dir, 10, 1, 2).ok());
}

TEST(CheckpointStoreTest, UnparsableManifestMeansIncomplete) {
  std::string dir = FreshDir("badmanifest");
  WriteCheckpoint(dir, 1, 1);
  WriteCheckpoint(dir, 2, 1);
  ASSERT_TRUE(
      WriteFileAtomically(CheckpointStepDir(dir, 2) + "/manifest.json", "{\"st")
          .ok());
  EXPECT_EQ(**LatestCheckpoint(dir), 1);
  auto m = ReadCheckpointManifest(dir, 2);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(m.status().message(), HasSubstr("step_00000002/manifest.json"));
}

TEST(CheckpointStoreTest, CorruptedByteIsChecksumErrorNamingFile) {
  std::string dir = FreshDir("corrupt");
  WriteCheckpoint(dir, 5, 2);
  std::string path = CheckpointStagePath(dir, 5, 1);
  std::string bytes = *ReadFileToString(path);
  bytes[bytes.size() - 3] ^= 0x01;  // a flipped bit in tensor data
  ASSERT_TRUE(WriteFileAtomically(path, bytes).ok());
  auto read = ReadStageFile(dir, 5, 1, 2);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.status().message(), HasSubstr(path));
  EXPECT_THAT(read.status().message(), HasSubstr("checksum mismatch"));
  // Stage 0 is still fine.
  EXPECT_TRUE(ReadStageFile(dir, 5, 0, 2).ok());
}

TEST(CheckpointStoreTest, TruncatedStageFileNamesSizes) {
  std::string dir = FreshDir("truncated");
  WriteCheckpoint(dir, 5, 1);
  std::string path = CheckpointStagePath(dir, 5, 0);
  std::string bytes = *ReadFileToString(path);
  ASSERT_TRUE(
      WriteFileAtomically(path, bytes.substr(0, bytes.size() - 4)).ok());
  auto read = ReadStageFile(dir, 5, 0, 1);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.status().message(), HasSubstr(path));
  EXPECT_THAT(read.status().message(), HasSubstr("(truncated)"));
}

// The folders of `dir` whose names start with `prefix`.
std::vector<std::string> FoldersStartingWith(const std::string& dir,
                                             const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

TEST(CheckpointStoreTest, BadNewestCheckpointsAreSetAsideNotDeleted) {
  std::string dir = FreshDir("setaside");
  WriteCheckpoint(dir, 10, 2);
  WriteCheckpoint(dir, 20, 2);
  WriteCheckpoint(dir, 30, 2);
  // 30: a flipped bit; 20: truncated.
  std::string p30 = CheckpointStagePath(dir, 30, 1);
  std::string bytes = *ReadFileToString(p30);
  bytes[bytes.size() - 3] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomically(p30, bytes).ok());
  std::string p20 = CheckpointStagePath(dir, 20, 0);
  bytes = *ReadFileToString(p20);
  ASSERT_TRUE(WriteFileAtomically(p20, bytes.substr(0, 10)).ok());

  auto v = LatestVerifiedCheckpoint(dir);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->step, std::optional<int64_t>(10));
  ASSERT_EQ(v->set_aside.size(), 2u);
  EXPECT_THAT(v->set_aside[0], HasSubstr("step 30: "));
  EXPECT_THAT(v->set_aside[0], HasSubstr("checksum mismatch"));
  EXPECT_THAT(v->set_aside[0],
              HasSubstr("moved to " + dir + "/step_00000030.bad-"));
  EXPECT_THAT(v->set_aside[1], HasSubstr("step 20: "));
  EXPECT_THAT(v->set_aside[1], HasSubstr("(truncated)"));
  // Kept, with their files, under names no resume or prune looks at.
  EXPECT_FALSE(Exists(CheckpointStepDir(dir, 30)));
  ASSERT_EQ(FoldersStartingWith(dir, "step_00000030.bad-").size(), 1u);
  const std::string kept =
      dir + "/" + FoldersStartingWith(dir, "step_00000030.bad-")[0];
  EXPECT_TRUE(Exists(kept + "/stage_1.safetensors"));
  EXPECT_TRUE(Exists(kept + "/manifest.json"));
  EXPECT_THAT(*ListCompleteCheckpoints(dir), ElementsAre(10));
  ASSERT_TRUE(PruneCheckpoints(dir, 1).ok());
  EXPECT_EQ(FoldersStartingWith(dir, "step_00000030.bad-").size(), 1u);
  EXPECT_EQ(FoldersStartingWith(dir, "step_00000020.bad-").size(), 1u);
  // A second look finds 10 at once.
  v = LatestVerifiedCheckpoint(dir);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->step, std::optional<int64_t>(10));
  EXPECT_TRUE(v->set_aside.empty());
}

TEST(CheckpointStoreTest, CheckpointsAfterTheLimitAreNotLookedAt) {
  std::string dir = FreshDir("max_step");
  WriteCheckpoint(dir, 10, 1);
  WriteCheckpoint(dir, 20, 1);
  // 30 is damaged but after the limit: neither taken nor set aside.
  WriteCheckpoint(dir, 30, 1);
  const std::string p30 = CheckpointStagePath(dir, 30, 0);
  ASSERT_TRUE(WriteFileAtomically(p30, "x").ok());
  auto v = LatestVerifiedCheckpoint(dir, /*max_step=*/25);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->step, std::optional<int64_t>(20));
  EXPECT_TRUE(v->set_aside.empty());
  EXPECT_TRUE(Exists(CheckpointStepDir(dir, 30)));
  v = LatestVerifiedCheckpoint(dir, /*max_step=*/5);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->step, std::nullopt);
}

TEST(CheckpointStoreTest, UnparsableManifestIsSetAsideButUncommittedIsLeft) {
  std::string dir = FreshDir("setaside_manifest");
  WriteCheckpoint(dir, 1, 1);
  WriteCheckpoint(dir, 2, 1);
  ASSERT_TRUE(
      WriteFileAtomically(CheckpointStepDir(dir, 2) + "/manifest.json", "{\"st")
          .ok());
  // Step 3 was being written when the process died: no manifest.
  ASSERT_TRUE(WriteStageFile(dir, 3, 0, StageContents(3, 0)).ok());
  auto v = LatestVerifiedCheckpoint(dir);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->step, std::optional<int64_t>(1));
  ASSERT_EQ(v->set_aside.size(), 1u);
  EXPECT_THAT(v->set_aside[0], HasSubstr("step 2: "));
  EXPECT_THAT(v->set_aside[0], HasSubstr("manifest.json"));
  EXPECT_TRUE(Exists(CheckpointStepDir(dir, 3)));
}

TEST(CheckpointStoreTest, NoneVerifiesIsAnErrorListingEveryReason) {
  std::string dir = FreshDir("setaside_none");
  WriteCheckpoint(dir, 4, 1);
  std::string p = CheckpointStagePath(dir, 4, 0);
  ASSERT_TRUE(WriteFileAtomically(p, "garbage").ok());
  auto v = LatestVerifiedCheckpoint(dir);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(v.status().message(),
              HasSubstr("no checkpoint in " + dir + " verifies: step 4: "));
  EXPECT_THAT(v.status().message(), HasSubstr("stage_0.safetensors"));
  // An empty folder just has no checkpoint.
  auto empty = LatestVerifiedCheckpoint(FreshDir("setaside_empty"));
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->step.has_value());
}

TEST(CheckpointStoreTest, CommitTakesTheDigestTheWriterRecorded) {
  std::string dir = FreshDir("digest");
  auto sha = WriteStageFile(dir, 3, 0, StageContents(3, 0));
  ASSERT_TRUE(sha.ok());
  const std::string path = CheckpointStagePath(dir, 3, 0);
  auto digest = ReadFileToString(path + ".sha256");
  ASSERT_TRUE(digest.ok());
  EXPECT_EQ(*digest, *sha + " " + std::to_string(*FileSize(path)) + "\n");
  // The commit does not read the file back: a digest of the right size is
  // taken as written (here a wrong one, so the load's check catches it).
  ASSERT_TRUE(WriteFileAtomically(path + ".sha256",
                                  std::string(64, 'a') + " " +
                                      std::to_string(*FileSize(path)) + "\n")
                  .ok());
  ASSERT_TRUE(CommitCheckpoint(dir, 3, 1, "{}").ok());
  EXPECT_EQ(ReadCheckpointManifest(dir, 3)->stages[0].sha256,
            std::string(64, 'a'));
  EXPECT_THAT(ReadStageFile(dir, 3, 0, 1).status().message(),
              HasSubstr("checksum mismatch"));
}

TEST(CheckpointStoreTest, CommitHashesFilesWithoutADigest) {
  std::string dir = FreshDir("nodigest");
  auto sha = WriteStageFile(dir, 4, 0, StageContents(4, 0));
  ASSERT_TRUE(sha.ok());
  const std::string path = CheckpointStagePath(dir, 4, 0);
  ASSERT_EQ(std::remove((path + ".sha256").c_str()), 0);
  ASSERT_TRUE(CommitCheckpoint(dir, 4, 1, "{}").ok());
  EXPECT_EQ(ReadCheckpointManifest(dir, 4)->stages[0].sha256, *sha);
  EXPECT_TRUE(ReadStageFile(dir, 4, 0, 1).ok());
}

TEST(CheckpointStoreTest, MissingStageFileAfterCommit) {
  std::string dir = FreshDir("missing_after");
  WriteCheckpoint(dir, 5, 2);
  std::string path = CheckpointStagePath(dir, 5, 1);
  ASSERT_EQ(std::remove(path.c_str()), 0);
  auto read = ReadStageFile(dir, 5, 1, 2);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr(path));
}

TEST(CheckpointStoreTest, StageOutOfRangeAndNumStagesMismatch) {
  std::string dir = FreshDir("range");
  WriteCheckpoint(dir, 5, 2);
  auto out = ReadStageFile(dir, 5, 2, 2);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("stage 2 out of range [0, 2)"));
  EXPECT_THAT(out.status().message(), HasSubstr("stage_2.safetensors"));
  auto mismatch = ReadStageFile(dir, 5, 0, 3);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.status().message(),
              HasSubstr("checkpoint has 2 pipeline stages but this job has 3"));
  EXPECT_THAT(mismatch.status().message(), HasSubstr("manifest.json"));
}

TEST(CheckpointStoreTest, CommitNeedsEveryStageFile) {
  std::string dir = FreshDir("commit_missing");
  ASSERT_TRUE(WriteStageFile(dir, 3, 0, StageContents(3, 0)).ok());
  absl::Status s = CommitCheckpoint(dir, 3, 2, "{}");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("step_00000003/stage_1.safetensors"));
  EXPECT_FALSE(Exists(CheckpointStepDir(dir, 3) + "/manifest.json"));
  // No folder at all.
  s = CommitCheckpoint(dir, 4, 1, "{}");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("step_00000004"));
}

TEST(CheckpointStoreTest, CommitRemovesLeftoverStagesAndRejectsGarbage) {
  std::string dir = FreshDir("commit_extra");
  // An uncommitted 3-stage attempt at step 3 (a crash before the manifest),
  // then a 2-stage run commits step 3: the leftover stage_2 goes away.
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(WriteStageFile(dir, 3, k, StageContents(3, k)).ok());
  }
  absl::Status s = CommitCheckpoint(dir, 3, 2, "{}");
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(FileSize(CheckpointStagePath(dir, 3, 2)).ok());
  auto manifest = ReadCheckpointManifest(dir, 3);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->num_stages, 2);

  ASSERT_TRUE(CreateDirectories(CheckpointStepDir(dir, 4)).ok());
  ASSERT_TRUE(
      WriteFileAtomically(CheckpointStagePath(dir, 4, 0), "garbage!").ok());
  s = CommitCheckpoint(dir, 4, 1, "{}");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("step_00000004/stage_0.safetensors"));
}

TEST(CheckpointStoreTest, RewritingAStageUncommitsTheStep) {
  std::string dir = FreshDir("rewrite");
  WriteCheckpoint(dir, 1, 1);
  WriteCheckpoint(dir, 2, 1);
  ASSERT_TRUE(WriteStageFile(dir, 2, 0, StageContents(99, 0)).ok());
  EXPECT_EQ(**LatestCheckpoint(dir), 1);
  ASSERT_TRUE(CommitCheckpoint(dir, 2, 1, "{}").ok());
  auto read = ReadStageFile(dir, 2, 0, 1);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->metadata.at("step"), "99");
}

TEST(CheckpointStoreTest, PruneKeepsNewestK) {
  std::string dir = FreshDir("prune");
  for (int64_t step : {10, 20, 30, 40}) WriteCheckpoint(dir, step, 2);
  ASSERT_TRUE(PruneCheckpoints(dir, 2).ok());
  EXPECT_THAT(*ListCompleteCheckpoints(dir), ElementsAre(30, 40));
  EXPECT_FALSE(Exists(CheckpointStepDir(dir, 10)));
  EXPECT_FALSE(Exists(CheckpointStepDir(dir, 20)));
  ASSERT_TRUE(PruneCheckpoints(dir, 1).ok());
  EXPECT_THAT(*ListCompleteCheckpoints(dir), ElementsAre(40));
  EXPECT_TRUE(ReadStageFile(dir, 40, 1, 2).ok());
}

TEST(CheckpointStoreTest, PruneZeroKeepsAllCompleteButDropsOldIncomplete) {
  std::string dir = FreshDir("prune_incomplete");
  WriteCheckpoint(dir, 10, 1);
  ASSERT_TRUE(WriteStageFile(dir, 15, 0, StageContents(15, 0)).ok());  // crash
  WriteCheckpoint(dir, 20, 1);
  ASSERT_TRUE(WriteStageFile(dir, 25, 0, StageContents(25, 0)).ok());  // live
  ASSERT_TRUE(PruneCheckpoints(dir, 0).ok());
  EXPECT_THAT(*ListCompleteCheckpoints(dir), ElementsAre(10, 20));
  EXPECT_FALSE(Exists(CheckpointStepDir(dir, 15)));
  EXPECT_TRUE(Exists(CheckpointStagePath(dir, 25, 0)));  // may be in progress
}

TEST(CheckpointStoreTest, PruneNeverDeletesNewestComplete) {
  std::string dir = FreshDir("prune_newest");
  WriteCheckpoint(dir, 10, 1);
  ASSERT_TRUE(WriteStageFile(dir, 20, 0, StageContents(20, 0)).ok());
  ASSERT_TRUE(PruneCheckpoints(dir, 1).ok());
  EXPECT_THAT(*ListCompleteCheckpoints(dir), ElementsAre(10));
  EXPECT_TRUE(Exists(CheckpointStagePath(dir, 20, 0)));
  EXPECT_THAT(PruneCheckpoints(dir, -1).message(), HasSubstr("keep_last"));
  // Nothing complete: nothing is touched.
  std::string empty = FreshDir("prune_empty");
  ASSERT_TRUE(WriteStageFile(empty, 1, 0, StageContents(1, 0)).ok());
  ASSERT_TRUE(PruneCheckpoints(empty, 1).ok());
  EXPECT_TRUE(Exists(CheckpointStagePath(empty, 1, 0)));
}

TEST(CheckpointStoreTest, BadArguments) {
  std::string dir = FreshDir("args");
  EXPECT_EQ(WriteStageFile(dir, -1, 0, StageContents(0, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteStageFile(dir, 0, -1, StageContents(0, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CommitCheckpoint(dir, 0, 0, "{}").code(),
            absl::StatusCode::kInvalidArgument);
  SafetensorsFile dup;
  dup.tensors.emplace_back("x", Tensor::FromVector({1}, {1}));
  dup.tensors.emplace_back("x", Tensor::FromVector({1}, {1}));
  auto s = WriteStageFile(dir, 0, 0, dup);
  EXPECT_THAT(s.status().message(), HasSubstr("stage_0.safetensors"));
  EXPECT_THAT(s.status().message(), HasSubstr("\"x\" appears twice"));
}

}  // namespace
}  // namespace trainyard
