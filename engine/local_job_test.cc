// The engine's end-to-end properties, in one process:
// - the stage split and the schedule do not change the arithmetic;
// - the microbatch count changes it only by rounding;
// - reruns and resumed runs are bitwise the uninterrupted run.
#include "engine/local_job.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>

#include "absl/synchronization/mutex.h"
#include "engine/checkpoint_store.h"
#include "engine/test_jobs.h"
#include "engine/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

using testing::ClassificationSpec;
using testing::DeepClassificationSpec;
using testing::PluginDir;
using testing::RunJob;
using testing::RunResult;
using testing::TempDir;
using testing::WithPipeline;

// A run's losses, grad norms, evals and final weights are `ref`'s bits.
void ExpectSameBits(const RunResult& r, const RunResult& ref) {
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.losses, ref.losses);  // exact double equality
  EXPECT_EQ(r.grad_norms, ref.grad_norms);
  EXPECT_EQ(r.eval_loss, ref.eval_loss);
  EXPECT_EQ(r.params, ref.params);  // exact float equality
}

TEST(LocalJobTest, StageSplitAndScheduleAreBitwiseInvisible) {
  const auto base = ClassificationSpec();
  RunResult ref = RunJob(WithPipeline(base, 1, 4, "1f1b"));
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  ASSERT_EQ(ref.losses.size(), 30u);
  ASSERT_EQ(ref.params.size(), 21u);  // every parameter of the 4 blocks
  for (int stages : {1, 2, 4}) {
    for (const char* schedule : {"gpipe", "1f1b", "zbh1"}) {
      SCOPED_TRACE(::testing::Message() << "S=" << stages << " " << schedule);
      RunResult r = RunJob(WithPipeline(base, stages, 4, schedule));
      ExpectSameBits(r, ref);
    }
  }
}

// parallelism.accumulation "tree" (docs/ACCUMULATION.md) keeps the split
// and schedule invisible too, and trains to the same place up to rounding.
TEST(LocalJobTest, TreeAccumulationIsAlsoBitwiseInvisibleToSplitAndSchedule) {
  auto base = ClassificationSpec();
  base.mutable_parallelism()->set_accumulation("tree");
  RunResult ref = RunJob(WithPipeline(base, 1, 8, "1f1b"));
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  for (int stages : {2, 4}) {
    for (const char* schedule : {"gpipe", "1f1b", "zbh1"}) {
      SCOPED_TRACE(::testing::Message() << "S=" << stages << " " << schedule);
      RunResult r = RunJob(WithPipeline(base, stages, 8, schedule));
      ASSERT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(r.losses, ref.losses);
      EXPECT_EQ(r.grad_norms, ref.grad_norms);
      EXPECT_EQ(r.params, ref.params);
    }
  }
  auto sequential = base;
  sequential.mutable_parallelism()->set_accumulation("sequential");
  RunResult seq = RunJob(WithPipeline(sequential, 1, 8, "1f1b"));
  ASSERT_TRUE(seq.status.ok()) << seq.status;
  ASSERT_EQ(seq.losses.size(), ref.losses.size());
  for (size_t i = 0; i < seq.losses.size(); ++i) {
    EXPECT_NEAR(ref.losses[i], seq.losses[i], 1e-5 * std::abs(seq.losses[i]))
        << "step " << i + 1;
  }
  // The switch takes effect: another association, other weight bits.
  EXPECT_NE(ref.params, seq.params);
}

TEST(LocalJobTest, MicrobatchCountChangesLossOnlyByRounding) {
  const auto base = ClassificationSpec();
  RunResult m1 = RunJob(WithPipeline(base, 2, 1, "1f1b"));
  ASSERT_TRUE(m1.status.ok()) << m1.status;
  // The loss must actually go down, or agreement would mean little.
  EXPECT_LT(m1.losses.back(), 0.5 * m1.losses.front());
  for (int m : {4, 8}) {
    RunResult r = RunJob(WithPipeline(base, 2, m, "1f1b"));
    ASSERT_TRUE(r.status.ok()) << r.status;
    ASSERT_EQ(r.losses.size(), m1.losses.size());
    double worst = 0;
    for (size_t i = 0; i < r.losses.size(); ++i) {
      worst = std::max(
          worst, std::abs(r.losses[i] - m1.losses[i]) / std::abs(m1.losses[i]));
    }
    std::cout << "M=" << m << " vs M=1: max relative loss difference over "
              << r.losses.size() << " steps: " << worst << "\n";
    EXPECT_LE(worst, 1e-5) << "M=" << m;
  }
}

TEST(LocalJobTest, SameSeedIsBitwiseRepeatable) {
  const auto spec = WithPipeline(ClassificationSpec(), 2, 4, "1f1b");
  RunResult a = RunJob(spec);
  RunResult b = RunJob(spec);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.params, b.params);
  auto other = spec;
  other.set_seed(8);
  RunResult c = RunJob(other);
  ASSERT_TRUE(c.status.ok());
  EXPECT_NE(c.losses, a.losses);
}

TEST(LocalJobTest, StopAndResumeIsBitwiseTheUninterruptedRun) {
  const std::string dir = TempDir() + "/ckpt";
  auto spec = WithPipeline(ClassificationSpec(), 2, 4, "1f1b");
  spec.set_steps(20);
  RunResult full = RunJob(spec);
  ASSERT_TRUE(full.status.ok()) << full.status;

  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_every(5);
  spec.mutable_checkpoint()->set_resume("latest");
  RunResult first = RunJob(spec, /*stop_after=*/10);
  ASSERT_TRUE(first.status.ok()) << first.status;
  ASSERT_EQ(first.losses.size(), 10u);
  RunResult second = RunJob(spec);
  ASSERT_TRUE(second.status.ok()) << second.status;
  ASSERT_EQ(second.losses.size(), 10u);  // steps 11..20 only
  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(joined, full.losses);
  EXPECT_EQ(second.params, full.params);
}

// A corrupt newest checkpoint (one flipped bit) is set aside and the job
// resumes from the one before, still bitwise the uninterrupted run.
TEST(LocalJobTest, CorruptNewestCheckpointFallsBackBitwise) {
  const std::string dir = TempDir() + "/ckpt_fallback";
  auto spec = WithPipeline(ClassificationSpec(), 2, 4, "1f1b");
  spec.set_steps(20);
  RunResult full = RunJob(spec);
  ASSERT_TRUE(full.status.ok()) << full.status;
  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_every(5);
  spec.mutable_checkpoint()->set_resume("latest");
  ASSERT_TRUE(RunJob(spec, /*stop_after=*/15).status.ok());
  const std::string path = CheckpointStagePath(dir, 15, 1);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  in.close();
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() - 7] ^= 0x10;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;

  RunResult rest = RunJob(spec);
  ASSERT_TRUE(rest.status.ok()) << rest.status;
  ASSERT_EQ(rest.losses.size(), 10u);  // steps 11..20: resumed from 10
  EXPECT_EQ(std::vector<double>(full.losses.begin() + 10, full.losses.end()),
            rest.losses);
  EXPECT_EQ(rest.params, full.params);
}

// A damaged manifest does not make a checkpoint disappear: the job does not
// start over from step 0, it reports the bad checkpoint.
TEST(LocalJobTest, DamagedManifestOfTheOnlyCheckpointIsNotIgnored) {
  const std::string dir = TempDir() + "/ckpt_bad_manifest";
  auto spec = WithPipeline(ClassificationSpec(), 2, 4, "1f1b");
  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_every(5);
  spec.mutable_checkpoint()->set_resume("latest");
  ASSERT_TRUE(RunJob(spec, 5).status.ok());
  const std::string manifest = CheckpointStepDir(dir, 5) + "/manifest.json";
  std::ofstream(manifest, std::ios::trunc) << "{\"format\": ";
  auto never = spec;
  never.mutable_checkpoint()->set_resume("never");
  RunResult refused = RunJob(never);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status.message(), HasSubstr("already holds checkpoints"));
  RunResult r = RunJob(spec);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status.message(), HasSubstr("no checkpoint in " + dir));
  EXPECT_THAT(r.status.message(), HasSubstr("manifest.json"));
  EXPECT_TRUE(r.losses.empty());
}

TEST(LocalJobTest, ResumeIntoAnotherStageSplitIsBitwise) {
  const std::string dir = TempDir() + "/ckpt_resplit";
  auto spec = WithPipeline(ClassificationSpec(), 4, 4, "gpipe");
  spec.set_steps(12);
  RunResult full = RunJob(spec);
  ASSERT_TRUE(full.status.ok()) << full.status;
  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_every(6);
  spec.mutable_checkpoint()->set_resume("latest");
  ASSERT_TRUE(RunJob(spec, 6).status.ok());
  RunResult rest = RunJob(WithPipeline(spec, 2, 4, "1f1b"));
  ASSERT_TRUE(rest.status.ok()) << rest.status;
  EXPECT_EQ(rest.params, full.params);
}

// Model chunks (schedules "interleaved" and "zbv") keep the arithmetic too:
// every schedule, chunk count and stage split gives the same bits.
TEST(LocalJobTest, ChunkedSchedulesAreBitwiseInvisible) {
  auto base = DeepClassificationSpec();
  base.set_steps(12);
  RunResult ref = RunJob(WithPipeline(base, 1, 8, "1f1b"));
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  ASSERT_EQ(ref.losses.size(), 12u);
  ASSERT_EQ(ref.params.size(), 40u);  // every parameter of the 8 blocks
  struct Case {
    int stages;
    const char* schedule;
    int chunks;  // 0: the schedule's default
  };
  for (Case c :
       {Case{1, "interleaved", 0}, Case{1, "zbv", 0}, Case{2, "interleaved", 0},
        Case{2, "interleaved", 4}, Case{2, "zbv", 0}, Case{4, "interleaved", 0},
        Case{4, "zbv", 0}}) {
    SCOPED_TRACE(::testing::Message() << "S=" << c.stages << " " << c.schedule
                                      << " chunks=" << c.chunks);
    auto spec = WithPipeline(base, c.stages, 8, c.schedule);
    spec.mutable_parallelism()->set_chunks(c.chunks);
    RunResult r = RunJob(spec);
    ExpectSameBits(r, ref);
  }
}

// Data-parallel replicas (parallelism.replicas): for the same global batch
// and microbatch count, R = 1, 2 and 4 give the same bits for every stage
// split and schedule (docs/ACCUMULATION.md).
TEST(LocalJobTest, ReplicasAreBitwiseInvisible) {
  auto base = DeepClassificationSpec();
  base.mutable_parallelism()->set_accumulation("tree");
  base.set_steps(12);
  RunResult ref = RunJob(WithPipeline(base, 1, 8, "1f1b"));
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  ASSERT_EQ(ref.losses.size(), 12u);
  int runs = 0;
  for (int replicas : {1, 2, 4}) {
    for (int stages : {1, 2, 4}) {
      for (const char* schedule :
           {"gpipe", "1f1b", "zbh1", "interleaved", "zbv"}) {
        // Interleaved runs its microbatches in groups of S.
        if (std::string(schedule) == "interleaved" &&
            (8 / replicas) % stages != 0) {
          continue;
        }
        SCOPED_TRACE(::testing::Message()
                     << "R=" << replicas << " S=" << stages << " " << schedule);
        auto spec = WithPipeline(base, stages, 8, schedule);
        spec.mutable_parallelism()->set_replicas(replicas);
        RunResult r = RunJob(spec);
        ExpectSameBits(r, ref);
        ++runs;
      }
    }
  }
  EXPECT_EQ(runs, 44);  // 45 combinations, less interleaved at R=4, S=4
}

// One microbatch per replica: the stage keeps no tree (the tree of one
// gradient is that gradient, written straight into the gradient buffer),
// and the run is still R = 1's bits; one microbatch under "tree" is
// "sequential"'s.
TEST(LocalJobTest, OneMicrobatchPerReplicaIsTheTreesBits) {
  auto base = DeepClassificationSpec();
  base.mutable_parallelism()->set_accumulation("tree");
  base.set_steps(6);
  for (int microbatches : {2, 4}) {
    SCOPED_TRACE(::testing::Message() << "M=R=" << microbatches);
    RunResult ref = RunJob(WithPipeline(base, 1, microbatches, "1f1b"));
    ASSERT_TRUE(ref.status.ok()) << ref.status;
    auto spec = WithPipeline(base, 2, microbatches, "1f1b");
    spec.mutable_parallelism()->set_replicas(microbatches);
    ExpectSameBits(RunJob(spec), ref);
  }
  RunResult tree = RunJob(WithPipeline(base, 2, 1, "1f1b"));
  auto sequential = WithPipeline(base, 2, 1, "1f1b");
  sequential.mutable_parallelism()->set_accumulation("sequential");
  ExpectSameBits(RunJob(sequential), tree);
}

// Runs 12 steps of `full`; then 6 of `first` with a checkpoint after step
// 6 in `dir`, and the rest as `second` resumed from it: the resumed steps
// and the final weights must be `full`'s bits.
void ExpectResumeIsBitwise(v1::JobSpec full_spec, v1::JobSpec first,
                           v1::JobSpec second, const std::string& dir) {
  full_spec.set_steps(12);
  RunResult full = RunJob(full_spec);
  ASSERT_TRUE(full.status.ok()) << full.status;
  for (v1::JobSpec* spec : {&first, &second}) {
    spec->set_steps(12);
    spec->mutable_checkpoint()->set_dir(dir);
    spec->mutable_checkpoint()->set_every(6);
    spec->mutable_checkpoint()->set_resume("latest");
  }
  ASSERT_TRUE(RunJob(first, 6).status.ok());
  RunResult rest = RunJob(second);
  ASSERT_TRUE(rest.status.ok()) << rest.status;
  ASSERT_EQ(rest.losses.size(), 6u);
  EXPECT_EQ(std::vector<double>(full.losses.begin() + 6, full.losses.end()),
            rest.losses);
  EXPECT_EQ(rest.params, full.params);
}

// A checkpoint written with one (R, S) resumes at another, bitwise (the
// state holds nothing that depends on R; the data cursor is the global
// batch's).
TEST(LocalJobTest, ResumeAtAnotherReplicaCountIsBitwise) {
  auto spec = WithPipeline(ClassificationSpec(), 2, 8, "1f1b");
  spec.mutable_parallelism()->set_accumulation("tree");
  auto first = spec;
  first.mutable_parallelism()->set_replicas(2);
  auto second = WithPipeline(spec, 4, 8, "zbh1");
  second.mutable_parallelism()->set_replicas(4);
  ExpectResumeIsBitwise(spec, first, second, TempDir() + "/ckpt_replicas");
}

// The same across schedules with and without chunks: a ZB-V run at R = 2,
// S = 2 resumes as interleaved 1F1B at R = 1, S = 4.
TEST(LocalJobTest, ResumeFromChunksIntoOtherChunksIsBitwise) {
  auto spec = WithPipeline(DeepClassificationSpec(), 1, 8, "1f1b");
  spec.mutable_parallelism()->set_accumulation("tree");
  auto first = WithPipeline(spec, 2, 8, "zbv");
  first.mutable_parallelism()->set_replicas(2);
  ExpectResumeIsBitwise(spec, first, WithPipeline(spec, 4, 8, "interleaved"),
                        TempDir() + "/ckpt_chunks");
}

// What replicas refuse, naming the field.
TEST(LocalJobTest, ReplicaSpecsAreChecked) {
  auto spec = WithPipeline(ClassificationSpec(), 2, 6, "1f1b");
  spec.mutable_parallelism()->set_replicas(4);  // 6 / 4
  RunResult r = RunJob(spec);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status.message(),
              HasSubstr("parallelism.replicas: parallelism.microbatches / "
                        "replicas must be a power of two"));
  spec = WithPipeline(ClassificationSpec(), 2, 8, "1f1b");
  spec.mutable_parallelism()->set_replicas(2);
  spec.mutable_parallelism()->set_accumulation("sequential");
  r = RunJob(spec);
  EXPECT_THAT(r.status.message(),
              HasSubstr("parallelism.accumulation: must be \"tree\" with "
                        "replicas > 1"));
}

TEST(LocalJobTest, RefusesToOverwriteCheckpointsWithoutResume) {
  const std::string dir = TempDir() + "/ckpt_refuse";
  auto spec = ClassificationSpec();
  spec.set_steps(2);
  spec.mutable_optimizer()->mutable_schedule()->set_warmup_steps(1);
  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_every(1);
  RunResult first = RunJob(spec);
  ASSERT_TRUE(first.status.ok()) << first.status;
  RunResult again = RunJob(spec);
  EXPECT_EQ(again.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status.message(), HasSubstr("already holds checkpoints"));
}

TEST(LocalJobTest, UnknownPluginFailsNamingIt) {
  auto spec = ClassificationSpec();
  spec.mutable_task()->set_plugin("no_such_task");
  RunResult r = RunJob(spec);
  EXPECT_FALSE(r.status.ok());
  EXPECT_THAT(r.status.message(), HasSubstr("no_such_task"));
}

TEST(StepJsonTest, IsValidJsonForAnyMetricName) {
  StepReport r;
  r.step = 3;
  r.loss = 0.1;
  r.lr = 1e-3;
  r.samples = 16;
  r.metrics = {{"acc\"ur\\acy\n", 0.5}, {"loss", 0.1}};
  const auto parsed = nlohmann::json::parse(StepJson(r, 0.5));
  EXPECT_EQ(parsed["step"], 3);
  EXPECT_EQ(parsed["acc\"ur\\acy\n"], 0.5);
  EXPECT_EQ(parsed["task_loss"], 0.1);  // a plugin's "loss" does not clash
  EXPECT_EQ(parsed["samples_per_sec"], 32.0);
}

// A test plugin ("misbehaving") picks its failure from its config.
trainyard::v1::JobSpec MisbehavingSpec(const std::string& mode, int fail_at) {
  auto spec = WithPipeline(ClassificationSpec(), 2, 4, "1f1b");
  spec.mutable_data()->set_eval_every(0);
  spec.mutable_data()->set_eval_fraction(0);
  spec.mutable_task()->set_plugin("misbehaving");
  auto& fields = *spec.mutable_task()->mutable_config()->mutable_fields();
  fields["mode"].set_string_value(mode);
  fields["fail_at_step"].set_number_value(fail_at);
  return spec;
}

TEST(LocalJobTest, NonFiniteGradientRefusesTheStepNamingStageAndParameter) {
  RunResult r =
      RunJob(MisbehavingSpec("huge_grad", -1), 0, PluginDir() + "/testdata");
  EXPECT_EQ(r.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status.message(),
              HasSubstr("step 1: stage 0 parameter blocks.0.norm.weight has a "
                        "non-finite gradient; step refused"));
  EXPECT_TRUE(r.losses.empty());
}

// Checkpoints are written and committed in the background, so the newest
// committed one when step 8 fails is step 4 or 6 (4 at the latest: a
// checkpoint still pending when the next is due is finished first). What a
// failure must never do is lose or damage a committed checkpoint.
TEST(LocalJobTest, PluginFailureMidRunKeepsEarlierCheckpoints) {
  const std::string dir = TempDir() + "/ckpt_plugin_failure";
  auto spec = MisbehavingSpec("loss_error_at_step", 7);  // 0-based step 7
  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_every(2);
  spec.mutable_checkpoint()->set_resume("latest");
  RunResult r = RunJob(spec, 0, PluginDir() + "/testdata");
  EXPECT_FALSE(r.status.ok());
  EXPECT_THAT(r.status.message(), HasSubstr("plugin \"misbehaving\""));
  EXPECT_THAT(r.status.message(), HasSubstr("injected failure at step 7"));
  EXPECT_EQ(r.losses.size(), 7u);
  auto latest = LatestCheckpoint(dir);
  ASSERT_TRUE(latest.ok());
  ASSERT_TRUE(latest->has_value());
  EXPECT_TRUE(**latest == 4 || **latest == 6) << **latest;
  // The saved checkpoint still loads: the rerun resumes after it and fails
  // at the same place again.
  RunResult again = RunJob(spec, 0, PluginDir() + "/testdata");
  EXPECT_THAT(again.status.message(), HasSubstr("injected failure at step 7"));
  EXPECT_EQ(static_cast<int64_t>(again.losses.size()), 7 - **latest);
}

// The only checkpoint is corrupt: nothing to fall back to, so the job fails
// naming the file and why (and the bad checkpoint is kept, set aside).
TEST(LocalJobTest, CorruptOnlyCheckpointFailsNamingIt) {
  const std::string dir = TempDir() + "/ckpt_corrupt";
  auto spec = WithPipeline(ClassificationSpec(), 2, 4, "1f1b");
  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_every(5);
  spec.mutable_checkpoint()->set_resume("latest");
  ASSERT_TRUE(RunJob(spec, 5).status.ok());
  const std::string victim = CheckpointStagePath(dir, 5, 1);
  {
    FILE* f = std::fopen(victim.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, -3, SEEK_END);
    std::fputc(0x5a, f);
    std::fclose(f);
  }
  RunResult r = RunJob(spec);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status.message(), HasSubstr("no checkpoint in " + dir));
  EXPECT_THAT(r.status.message(), HasSubstr(victim));
  EXPECT_THAT(r.status.message(), HasSubstr("checksum mismatch"));
  EXPECT_TRUE(r.losses.empty());
}

}  // namespace
}  // namespace trainyard
