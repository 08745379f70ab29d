#include "plan/job_plan.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using trainyard::v1::JobSpec;

// A fresh folder per test under the test's temp dir.
std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir =
      JoinPath(::testing::TempDir(), absl::StrCat("job_plan_", info->name()));
  EXPECT_TRUE(CreateDirectories(dir).ok());
  return dir;
}

// Writes a version 1.0 .npy file with any dtype descriptor (so tests can
// make files the reader accepts but the planner must refuse), zero data.
void WriteRawNpy(const std::string& path, const std::string& descr,
                 const std::vector<int64_t>& shape, size_t elem_size) {
  std::string dims;
  int64_t n = 1;
  for (int64_t d : shape) {
    absl::StrAppend(&dims, d, ",");
    n *= d;
  }
  if (shape.size() > 1) dims.pop_back();
  std::string header =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': (", dims, "), }");
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out += std::string(static_cast<size_t>(n) * elem_size, '\0');
  ASSERT_TRUE(WriteFileAtomically(path, out).ok()) << path;
}

JobSpec Parse(const std::string& json) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecJson(json, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

// A valid spec over data/x.npy float32 [10, 8] and data/y.npy float32
// [10, 3] in `dir`: blocks 8 -> 16 -> 16 (layernorm, residual) -> 3.
JobSpec ValidNpySpec(const std::string& dir) {
  EXPECT_TRUE(CreateDirectories(JoinPath(dir, "data")).ok());
  WriteRawNpy(JoinPath(dir, "data/x.npy"), "<f4", {10, 8}, 4);
  WriteRawNpy(JoinPath(dir, "data/y.npy"), "<f4", {10, 3}, 4);
  return Parse(R"({
    "name": "t",
    "steps": 100,
    "seed": 42,
    "model": {"blocks": [
      {"outFeatures": 16, "ffnHiddenSize": 32},
      {"outFeatures": 16, "ffnHiddenSize": 32, "residual": true,
       "norm": "layernorm"},
      {"outFeatures": 3, "ffnHiddenSize": 8}
    ]},
    "parallelism": {"stages": 2},
    "optimizer": {"lr": 0.001},
    "task": {"plugin": "mse"},
    "data": {
      "train": {"npy": {"features": "data/x.npy", "targets": "data/y.npy"}},
      "batchSize": 4
    }
  })");
}

PlanOptions Options(const std::string& dir) {
  PlanOptions o;
  o.base_dir = dir;
  o.memory_limit_bytes = uint64_t{1} << 40;
  return o;
}

std::vector<std::string> Lines(const absl::Status& status) {
  return absl::StrSplit(std::string(status.message()), '\n');
}

// Asserts the plan failed validation and `line` is one of the problems.
void ExpectProblem(const absl::StatusOr<JobPlan>& plan,
                   const std::string& line) {
  ASSERT_FALSE(plan.ok()) << "expected problem: " << line;
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Lines(plan.status()), Contains(line)) << "message was:\n"
                                                    << plan.status().message();
}

TEST(PlanJobTest, ValidSpecGetsDefaultsSplitAndParams) {
  const std::string dir = TestDir();
  absl::StatusOr<JobPlan> plan = PlanJob(ValidNpySpec(dir), Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const JobSpec& s = plan->spec;

  EXPECT_EQ(plan->feature_dim, 8);
  EXPECT_EQ(plan->output_dim, 3);
  EXPECT_FALSE(plan->class_targets);
  EXPECT_EQ(plan->train_rows, 10);
  ASSERT_EQ(s.model().blocks_size(), 3);
  EXPECT_EQ(s.model().blocks(0).in_features(), 8);
  EXPECT_EQ(s.model().blocks(1).in_features(), 16);
  EXPECT_EQ(s.model().blocks(2).in_features(), 16);
  for (const auto& b : s.model().blocks()) {
    EXPECT_EQ(b.activation(), "gelu");
    EXPECT_TRUE(b.has_bias() && b.bias());
  }
  EXPECT_EQ(s.model().blocks(0).norm(), "none");
  EXPECT_EQ(s.model().blocks(1).norm(), "layernorm");
  ASSERT_EQ(plan->blocks.size(), 3u);
  EXPECT_EQ(plan->blocks[1].norm, NormType::kLayerNorm);
  EXPECT_EQ(plan->blocks[1].activation, Activation::kGelu);
  EXPECT_TRUE(plan->blocks[1].residual);
  EXPECT_EQ(plan->blocks[2].in_features, 16);

  EXPECT_EQ(s.parallelism().stages(), 2);
  EXPECT_EQ(s.parallelism().microbatches(), 1);
  EXPECT_EQ(s.parallelism().schedule(), "1f1b");
  // Param counts: block 0 = 32*8+32+16*32+16 = 816, block 1 = 16+16 + 544 +
  // 528 = 1104, block 2 = 8*16+8+3*8+3 = 163. [1, 2] -> max 1267 beats
  // [2, 1] -> max 1920.
  EXPECT_THAT(s.parallelism().split(), ::testing::ElementsAre(1, 2));
  EXPECT_EQ(plan->virtual_stage_begin, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(plan->num_stages(), 2);

  EXPECT_EQ(s.optimizer().type(), "adamw");
  EXPECT_DOUBLE_EQ(s.optimizer().beta1(), 0.9);
  EXPECT_DOUBLE_EQ(s.optimizer().beta2(), 0.999);
  EXPECT_DOUBLE_EQ(s.optimizer().eps(), 1e-8);
  EXPECT_DOUBLE_EQ(s.optimizer().weight_decay(), 0.01);
  EXPECT_EQ(s.optimizer().decay_mask(), "default");
  EXPECT_EQ(s.optimizer().schedule().type(), "constant");
  EXPECT_EQ(s.optimizer().schedule().total_steps(), 100);
  EXPECT_EQ(s.model().init().seed(), 42u);
  EXPECT_EQ(s.data().seed(), 42u);
  EXPECT_EQ(s.device(), "cpu");
  EXPECT_EQ(s.precision(), "fp32");
  EXPECT_EQ(s.checkpoint().resume(), "never");
  EXPECT_EQ(s.data().train().npy().features(), dir + "/data/x.npy");
  EXPECT_EQ(s.data().train().npy().targets(), dir + "/data/y.npy");

  std::vector<std::string> names;
  for (const auto& p : plan->params) {
    names.push_back(
        absl::StrCat(p.name, p.decay ? "+" : "-", ":", p.block, ":", p.stage));
  }
  EXPECT_EQ(absl::StrJoin(names, " "),
            "blocks.0.fc1.weight+:0:0 blocks.0.fc1.bias-:0:0 "
            "blocks.0.fc2.weight+:0:0 blocks.0.fc2.bias-:0:0 "
            "blocks.1.norm.weight-:1:1 blocks.1.norm.bias-:1:1 "
            "blocks.1.fc1.weight+:1:1 blocks.1.fc1.bias-:1:1 "
            "blocks.1.fc2.weight+:1:1 blocks.1.fc2.bias-:1:1 "
            "blocks.2.fc1.weight+:2:1 blocks.2.fc1.bias-:2:1 "
            "blocks.2.fc2.weight+:2:1 blocks.2.fc2.bias-:2:1");
  EXPECT_EQ(plan->params[2].shape, (Shape{16, 32}));
}

TEST(PlanJobTest, ExampleSpecFileLoadsAndPlans) {
  const std::string dir = TestDir();
  absl::StatusOr<JobSpec> spec =
      LoadJobSpecFile("plan/testdata/good_synthetic.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<JobPlan> plan = PlanJob(*spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->class_targets);
  EXPECT_EQ(plan->feature_dim, 16);
  EXPECT_EQ(plan->output_dim, 4);
  EXPECT_EQ(plan->num_stages(), 3);
  EXPECT_EQ(plan->spec.checkpoint().dir(), dir + "/ckpt");
  EXPECT_EQ(plan->spec.data().train().synthetic().seed(), 7u);
  EXPECT_EQ(plan->blocks[1].activation, Activation::kSwiglu);
  EXPECT_FALSE(plan->blocks[3].bias);
  // The task config survives as a Struct.
  EXPECT_TRUE(plan->spec.task().config().fields().count("label_smoothing") ==
              1);
}

TEST(PlanJobTest, SgdDefaultsAndPatternDecayMask) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_type("sgd");
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.mutable_optimizer()->set_nesterov(true);
  spec.mutable_optimizer()->set_decay_mask("patterns");
  spec.mutable_optimizer()->add_no_decay("blocks.*.fc1.*");
  spec.mutable_optimizer()->add_no_decay("*.norm.bias");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_DOUBLE_EQ(plan->spec.optimizer().weight_decay(), 0.0);
  EXPECT_FALSE(plan->spec.optimizer().has_beta1());
  std::vector<std::string> no_decay;
  for (const auto& p : plan->params) {
    if (!p.decay) no_decay.push_back(p.name);
  }
  EXPECT_EQ(absl::StrJoin(no_decay, " "),
            "blocks.0.fc1.weight blocks.0.fc1.bias blocks.1.norm.bias "
            "blocks.1.fc1.weight blocks.1.fc1.bias blocks.2.fc1.weight "
            "blocks.2.fc1.bias");
}

TEST(PlanJobTest, DecayMaskAllDecaysEverything) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_decay_mask("all");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const auto& p : plan->params) EXPECT_TRUE(p.decay) << p.name;
}

TEST(PlanJobTest, ExplicitSplitIsKept) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_parallelism()->add_split(2);
  spec.mutable_parallelism()->add_split(1);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->virtual_stage_begin, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(plan->params.back().stage, 1);
  EXPECT_EQ(plan->params.front().stage, 0);
}

TEST(BalancedSplitTest, MinimisesLargestStageWithEarlyStagesSmallerOnTies) {
  EXPECT_EQ(BalancedSplit({5, 5, 5, 5}, 3), (std::vector<int>{1, 1, 2}));
  EXPECT_EQ(BalancedSplit({1, 1, 1, 1, 1, 1}, 2), (std::vector<int>{3, 3}));
  EXPECT_EQ(BalancedSplit({10, 1, 1, 1, 10}, 3), (std::vector<int>{1, 3, 1}));
  EXPECT_EQ(BalancedSplit({5, 1, 1, 1, 1, 1, 5}, 3),
            (std::vector<int>{1, 5, 1}));
  // Optimum 9 = [4, 5]; [1, 2] | [3, 4, 5] would be 12.
  EXPECT_EQ(BalancedSplit({1, 2, 3, 4, 5}, 2), (std::vector<int>{3, 2}));
  EXPECT_EQ(BalancedSplit({7}, 1), (std::vector<int>{1}));
  EXPECT_EQ(BalancedSplit({3, 3, 3}, 3), (std::vector<int>{1, 1, 1}));
}

TEST(GlobMatchTest, StarMatchesAnyRunIncludingDots) {
  EXPECT_TRUE(GlobMatch("blocks.*.fc1.bias", "blocks.12.fc1.bias"));
  EXPECT_TRUE(GlobMatch("*bias", "blocks.0.norm.bias"));
  EXPECT_TRUE(GlobMatch("*", "x"));
  EXPECT_TRUE(GlobMatch("blocks.0.*", "blocks.0.fc2.weight"));
  EXPECT_FALSE(GlobMatch("blocks.*.fc1.bias", "blocks.1.fc2.bias"));
  EXPECT_FALSE(GlobMatch("blocks.1.*", "blocks.10.fc1.bias"));
  EXPECT_FALSE(GlobMatch("fc1", "blocks.0.fc1.weight"));
}

// ---- One test per class of problem.

TEST(PlanJobErrorsTest, Steps) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.set_steps(0);
  ExpectProblem(PlanJob(spec, Options(dir)), "steps: must be > 0, got 0");
}

TEST(PlanJobErrorsTest, BlockWidths) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->mutable_blocks(2)->set_ffn_hidden_size(-4);
  spec.mutable_model()->mutable_blocks(0)->set_out_features(0);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "model.blocks[2].ffn_hidden_size: must be > 0, got -4");
  ExpectProblem(plan, "model.blocks[0].out_features: must be > 0, got 0");
}

TEST(PlanJobErrorsTest, NoBlocks) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->clear_blocks();
  ExpectProblem(PlanJob(spec, Options(dir)),
                "model.blocks: must have at least one block");
}

TEST(PlanJobErrorsTest, InFeaturesMismatch) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->mutable_blocks(0)->set_in_features(5);
  spec.mutable_model()->mutable_blocks(2)->set_in_features(32);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "model.blocks[0].in_features: must match the data's feature "
                "count (8), got 5");
  ExpectProblem(plan,
                "model.blocks[2].in_features: must match "
                "model.blocks[1].out_features (16), got 32");
}

TEST(PlanJobErrorsTest, ActivationAndNormNames) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->mutable_blocks(1)->set_activation("tanh");
  spec.mutable_model()->mutable_blocks(2)->set_norm("batchnorm");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "model.blocks[1].activation: must be one of \"relu\", "
                "\"gelu\", \"gelu_tanh\", \"swiglu\", got \"tanh\"");
  ExpectProblem(plan,
                "model.blocks[2].norm: must be one of \"none\", "
                "\"layernorm\", \"rmsnorm\", got \"batchnorm\"");
}

TEST(PlanJobErrorsTest, ResidualNeedsEqualWidths) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->mutable_blocks(0)->set_residual(true);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "model.blocks[0].residual: needs in_features == "
                "out_features, got 8 and 16");
}

TEST(PlanJobErrorsTest, LastBlockMustMatchTargets) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->mutable_blocks(2)->set_out_features(5);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "model.blocks[2].out_features: must equal the width K of "
                "data.train's targets (3), got 5");
}

TEST(PlanJobErrorsTest, StagesAndMicrobatches) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_parallelism()->set_stages(4);
  spec.mutable_parallelism()->set_microbatches(5);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "parallelism.stages: must be <= the number of blocks (3), "
                "got 4");
  ExpectProblem(plan,
                "parallelism.microbatches: must be <= data.batch_size (4), "
                "got 5");
  spec.mutable_parallelism()->set_stages(-1);
  spec.mutable_parallelism()->set_microbatches(-2);
  plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "parallelism.stages: must be >= 1, got -1");
  ExpectProblem(plan, "parallelism.microbatches: must be >= 1, got -2");
}

TEST(PlanJobErrorsTest, SyntheticLimitsAndEvalClassCount) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  auto* syn = spec.mutable_data()->mutable_train()->mutable_synthetic();
  syn->set_kind("gaussian_blobs");
  syn->set_num_samples(1);
  syn->set_num_features(1 << 24);
  syn->set_num_outputs(1 << 24);
  syn->set_noise(1);
  // 2^48 class-center values would not fit; a plan must not promise them.
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.train.synthetic.num_outputs: num_outputs * num_features "
                "must be <= 2^30, got 281474976710656");
  syn->set_num_features(7);
  syn->set_num_outputs(3);
  syn->set_num_samples(200);
  auto* eval = spec.mutable_data()->mutable_eval()->mutable_synthetic();
  *eval = *syn;
  eval->set_num_outputs(10);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.eval.synthetic: has 10 classes but data.train has 3");
}

TEST(PlanJobErrorsTest, ScheduleName) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_parallelism()->set_schedule("zb");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.schedule: must be one of \"gpipe\", \"1f1b\", "
                "\"zbh1\", \"interleaved\", \"zbv\", got \"zb\"");
}

TEST(PlanJobErrorsTest, Split) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  for (int n : {1, 0, 1}) spec.mutable_parallelism()->add_split(n);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "parallelism.split: must have one entry per stage (2), got 3");
  ExpectProblem(plan, "parallelism.split[1]: must be >= 1, got 0");
  spec.mutable_parallelism()->clear_split();
  spec.mutable_parallelism()->add_split(1);
  spec.mutable_parallelism()->add_split(1);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.split: must sum to the number of blocks (3), "
                "got 2");
}

// ValidNpySpec with a second 16 -> 16 block: 8 -> 16 -> 16 -> 16 -> 3.
JobSpec FourBlockSpec(const std::string& dir) {
  JobSpec spec = ValidNpySpec(dir);
  auto* blocks = spec.mutable_model()->mutable_blocks();
  *blocks->Add() = blocks->Get(2);
  *blocks->Mutable(2) = blocks->Get(1);
  return spec;
}

TEST(PlanJobErrorsTest, Chunks) {
  const std::string dir = TestDir();
  JobSpec spec = FourBlockSpec(dir);
  spec.mutable_parallelism()->set_chunks(2);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.chunks: schedule \"1f1b\" takes 1 chunk per stage "
                "(only \"interleaved\" and \"zbv\" take more), got 2");
  spec.mutable_parallelism()->set_schedule("zbv");
  spec.mutable_parallelism()->set_chunks(3);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.chunks: schedule \"zbv\" takes exactly 2 chunks "
                "per stage, got 3");
  spec.mutable_parallelism()->set_schedule("interleaved");
  spec.mutable_parallelism()->set_chunks(3);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.chunks: stages x chunks (2 x 3 virtual stages) "
                "must be <= the number of blocks (4)");
  spec.mutable_parallelism()->set_chunks(2);
  spec.mutable_parallelism()->set_microbatches(3);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.microbatches: schedule \"interleaved\" runs "
                "microbatches in groups of one per stage: microbatches per "
                "replica must be a multiple of stages (2), got 3");
  spec.mutable_parallelism()->set_microbatches(2);
  for (int n : {2, 2}) spec.mutable_parallelism()->add_split(n);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.split: must have one entry per virtual stage (2 "
                "stages x 2 chunks = 4), got 2");
  spec.mutable_parallelism()->clear_split();
  EXPECT_TRUE(PlanJob(spec, Options(dir)).ok());
}

TEST(PlanJobTest, ChunkedSchedulesCutTheModelIntoVirtualStages) {
  const std::string dir = TestDir();
  JobSpec spec = FourBlockSpec(dir);
  spec.mutable_parallelism()->set_microbatches(2);
  auto stage_of = [](const JobPlan& plan, int block) {
    for (const JobPlan::ParamSpec& ps : plan.params) {
      if (ps.block == block) return ps.stage;
    }
    return -1;
  };
  // Interleaved: chunk c of stage s is virtual stage 2c + s.
  spec.mutable_parallelism()->set_schedule("interleaved");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->spec.parallelism().chunks(), 2);  // the default
  EXPECT_THAT(plan->spec.parallelism().split(),
              ::testing::ElementsAre(1, 1, 1, 1));
  EXPECT_EQ(plan->num_chunks, 2);
  EXPECT_EQ(plan->num_stages(), 2);
  EXPECT_EQ(plan->num_virtual_stages(), 4);
  EXPECT_EQ(plan->ChunkBlocks(0, 1), std::make_pair(2, 3));
  EXPECT_EQ(plan->ChunkBlocks(1, 0), std::make_pair(1, 2));
  EXPECT_EQ(stage_of(*plan, 0), 0);
  EXPECT_EQ(stage_of(*plan, 1), 1);
  EXPECT_EQ(stage_of(*plan, 2), 0);
  EXPECT_EQ(stage_of(*plan, 3), 1);
  // ZB-V: stage 0 holds the first and the last virtual stage.
  spec.mutable_parallelism()->set_schedule("zbv");
  plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk_layout, ChunkLayout::kV);
  EXPECT_EQ(plan->ChunkBlocks(0, 1), std::make_pair(3, 4));
  EXPECT_EQ(plan->ChunkBlocks(1, 1), std::make_pair(2, 3));
  EXPECT_EQ(stage_of(*plan, 0), 0);
  EXPECT_EQ(stage_of(*plan, 1), 1);
  EXPECT_EQ(stage_of(*plan, 2), 1);
  EXPECT_EQ(stage_of(*plan, 3), 0);
  // The memory estimate counts each stage's peak (microbatch, chunk)
  // activations at its largest chunk: ZB-V, S = 2, M = 2 holds min(2M, 2S)
  // = 4 on each stage. Saved per sample (see the formula test): block 0 88,
  // blocks 1 and 2 114 each, block 3 35; backward scratch 88, 112, 112, 35.
  // b = 2: stage 0 2 * (4 * 88 + 88), stage 1 2 * (4 * 114 + 112).
  EXPECT_EQ(plan->memory.activations,
            4u * (2 * (4 * 88 + 88) + 2 * (4 * 114 + 112)));
  // The tree's partial sums: floor(log2 M) + 1 = 2 more gradient copies.
  const uint64_t grads = plan->memory.grads;
  spec.mutable_parallelism()->set_accumulation("tree");
  plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->memory.grads, 3 * grads);
}

TEST(PlanJobErrorsTest, OptimizerTypeAndLr) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_type("lamb");
  spec.mutable_optimizer()->set_lr(0);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "optimizer.type: must be one of \"adamw\", \"sgd\", got "
                "\"lamb\"");
  ExpectProblem(plan, "optimizer.lr: must be > 0 and finite, got 0");
  spec.mutable_optimizer()->set_type("adamw");
  spec.mutable_optimizer()->set_lr(std::numeric_limits<double>::infinity());
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.lr: must be > 0 and finite, got inf");
}

TEST(PlanJobErrorsTest, AdamwHyperparameters) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_beta1(1.0);
  spec.mutable_optimizer()->set_beta2(-0.1);
  spec.mutable_optimizer()->set_eps(0);
  spec.mutable_optimizer()->set_weight_decay(-0.5);
  spec.mutable_optimizer()->set_clip_grad(-1);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "optimizer.beta1: must be in [0, 1), got 1");
  ExpectProblem(plan, "optimizer.beta2: must be in [0, 1), got -0.1");
  ExpectProblem(plan, "optimizer.eps: must be > 0 and finite, got 0");
  ExpectProblem(plan,
                "optimizer.weight_decay: must be >= 0 and finite, got -0.5");
  ExpectProblem(plan, "optimizer.clip_grad: must be >= 0 and finite, got -1");
}

TEST(PlanJobErrorsTest, FieldsOfTheOtherOptimizer) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_momentum(0.9);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.momentum: only for sgd");
  spec.mutable_optimizer()->set_momentum(0);
  spec.mutable_optimizer()->set_type("sgd");
  spec.mutable_optimizer()->set_beta1(0.9);
  spec.mutable_optimizer()->set_eps(1e-6);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "optimizer.beta1: only for adamw");
  ExpectProblem(plan, "optimizer.eps: only for adamw");
}

TEST(PlanJobErrorsTest, SgdMomentumAndNesterov) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_type("sgd");
  spec.mutable_optimizer()->set_nesterov(true);
  spec.mutable_optimizer()->set_dampening(0.5);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.nesterov: requires momentum > 0 and dampening == 0 "
                "(as torch.optim.SGD), got momentum 0, dampening 0.5");
  spec.mutable_optimizer()->set_nesterov(false);
  spec.mutable_optimizer()->set_momentum(-0.9);
  spec.mutable_optimizer()->set_dampening(2);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "optimizer.momentum: must be >= 0 and finite, got -0.9");
  ExpectProblem(plan, "optimizer.dampening: must be in [0, 1], got 2");
}

TEST(PlanJobErrorsTest, DecayMaskAndPatterns) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_decay_mask("biases");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.decay_mask: must be one of \"default\", \"all\", "
                "\"patterns\", got \"biases\"");
  spec.mutable_optimizer()->set_decay_mask("all");
  spec.mutable_optimizer()->add_no_decay("*.bias");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.no_decay: only for decay_mask \"patterns\", got "
                "decay_mask \"all\"");
  spec.mutable_optimizer()->set_decay_mask("patterns");
  spec.mutable_optimizer()->add_no_decay("blocks.*.fc3.bias");
  spec.mutable_optimizer()->add_no_decay("blocks.[0].bias");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "optimizer.no_decay[1]: pattern \"blocks.*.fc3.bias\" "
                "matches no parameter");
  ExpectProblem(plan,
                "optimizer.no_decay[2]: must be a non-empty glob of "
                "[A-Za-z0-9_.*], got \"blocks.[0].bias\"");
  spec.mutable_optimizer()->clear_no_decay();
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.no_decay: decay_mask \"patterns\" needs at least "
                "one pattern");
}

TEST(PlanJobErrorsTest, LrSchedule) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  auto* sched = spec.mutable_optimizer()->mutable_schedule();
  sched->set_type("step");
  sched->set_warmup_steps(-1);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "optimizer.schedule.type: must be one of \"constant\", "
                "\"cosine\", \"linear\", got \"step\"");
  ExpectProblem(plan, "optimizer.schedule.warmup_steps: must be >= 0, got -1");
  sched->set_type("cosine");
  sched->set_warmup_steps(100);
  sched->set_min_lr(0.01);  // lr is 0.001
  plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "optimizer.schedule.warmup_steps: must be < total steps (100) "
                "when decaying, got 100");
  ExpectProblem(plan,
                "optimizer.schedule.min_lr: must be in [0, lr] = [0, 0.001], "
                "got 0.01");
  sched->set_type("constant");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.schedule.min_lr: only for schedule type \"cosine\" "
                "or \"linear\", got \"constant\"");
}

TEST(PlanJobErrorsTest, TaskPlugin) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_task()->set_plugin("../evil");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "task.plugin: must match [A-Za-z0-9_]+, got \"../evil\"");
  spec.mutable_task()->clear_plugin();
  ExpectProblem(PlanJob(spec, Options(dir)), "task.plugin: required");
}

TEST(PlanJobErrorsTest, MissingDataSource) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_data()->clear_train();
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.train: required (npy or synthetic)");
  spec.mutable_data()->mutable_train();  // present but empty oneof
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.train: needs a source: npy or synthetic");
}

TEST(PlanJobErrorsTest, NpyFileMissing) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_data()->mutable_train()->mutable_npy()->set_features(
      "data/nope.npy");
  ExpectProblem(PlanJob(spec, Options(dir)),
                absl::StrCat("data.train.npy.features: data/nope.npy (", dir,
                             "/data/nope.npy): no such file"));
}

TEST(PlanJobErrorsTest, NpyDtypesAndShapes) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  WriteRawNpy(JoinPath(dir, "data/xi.npy"), "<i8", {10, 8}, 8);
  WriteRawNpy(JoinPath(dir, "data/y2i.npy"), "<i4", {10, 2}, 4);
  auto* npy = spec.mutable_data()->mutable_train()->mutable_npy();
  npy->set_features("data/xi.npy");
  npy->set_targets("data/y2i.npy");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "data.train.npy.features: data/xi.npy: must be float32 "
                "[N, D], got int64 [10, 8]");
  ExpectProblem(plan,
                "data.train.npy.targets: data/y2i.npy: must be int32/int64 "
                "[N] (class ids) or float32 [N, K] (K >= 1), got int32 "
                "[10, 2]");
  // A dtype the .npy reader itself refuses: its message, under the field.
  WriteRawNpy(JoinPath(dir, "data/x8.npy"), "<f8", {10, 8}, 8);
  npy->set_features("data/x8.npy");
  plan = PlanJob(spec, Options(dir));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("\ndata.train.npy.features: "));
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("x8.npy"));
}

TEST(PlanJobErrorsTest, NpyRowCountsDiffer) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  WriteRawNpy(JoinPath(dir, "data/y9.npy"), "<i8", {9}, 8);
  spec.mutable_data()->mutable_train()->mutable_npy()->set_targets(
      "data/y9.npy");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.train.npy.targets: data/y9.npy: has 9 rows but features "
                "have 10");
}

TEST(PlanJobErrorsTest, Synthetic) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  auto* syn = spec.mutable_data()->mutable_train()->mutable_synthetic();
  syn->set_kind("spirals");
  syn->set_num_samples(0);
  syn->set_num_features(8);
  syn->set_num_outputs(3);
  syn->set_noise(-1);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "data.train.synthetic.kind: must be one of "
                "\"teacher_regression\", \"gaussian_blobs\", got \"spirals\"");
  ExpectProblem(plan, "data.train.synthetic.num_samples: must be > 0, got 0");
  ExpectProblem(plan,
                "data.train.synthetic.noise: must be >= 0 and finite, got -1");
  syn->set_kind("gaussian_blobs");
  syn->set_num_samples(100);
  syn->set_noise(0.1);
  syn->set_num_outputs(1);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.train.synthetic.num_outputs: must be in [2, 16777216] "
                "(number of classes), got 1");
  // A valid blobs source: the last block must output one logit per class.
  syn->set_num_outputs(4);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "model.blocks[2].out_features: must equal the number of "
                "classes of data.train (4), got 3");
}

TEST(PlanJobErrorsTest, EvalData) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  WriteRawNpy(JoinPath(dir, "data/ex.npy"), "<f4", {4, 7}, 4);
  WriteRawNpy(JoinPath(dir, "data/ey.npy"), "<f4", {4, 3}, 4);
  auto* npy = spec.mutable_data()->mutable_eval()->mutable_npy();
  npy->set_features("data/ex.npy");
  npy->set_targets("data/ey.npy");
  spec.mutable_data()->set_eval_fraction(0.5);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "data.eval.npy: has 7 features but data.train has 8");
  ExpectProblem(plan,
                "data.eval_fraction: must be 0 when data.eval is given, got "
                "0.5");
  spec.mutable_data()->clear_eval();
  spec.mutable_data()->set_eval_fraction(1.0);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.eval_fraction: must be in [0, 1), got 1");
  spec.mutable_data()->set_eval_fraction(0.05);  // floor(10 * 0.05) = 0
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.eval_fraction: holds out 0 of data.train's 10 rows; "
                "need at least 1 eval and 1 train row");
}

TEST(PlanJobErrorsTest, BatchSizeAndEvalEvery) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_data()->set_batch_size(0);
  spec.mutable_data()->set_eval_every(10);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "data.batch_size: must be > 0, got 0");
  ExpectProblem(plan,
                "data.eval_every: needs eval data: data.eval or "
                "data.eval_fraction > 0");
  spec.mutable_data()->set_eval_every(-1);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.eval_every: must be >= 0, got -1");
}

TEST(PlanJobErrorsTest, Checkpoint) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  auto* ckpt = spec.mutable_checkpoint();
  ckpt->set_every(10);
  ckpt->set_keep_last(-1);
  ckpt->set_resume("newest");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "checkpoint.every: needs checkpoint.dir");
  ExpectProblem(plan, "checkpoint.keep_last: must be >= 0, got -1");
  ExpectProblem(plan,
                "checkpoint.resume: must be one of \"never\", \"latest\", "
                "got \"newest\"");
  ckpt->set_dir("ck");
  ckpt->set_every(-5);
  ckpt->set_keep_last(0);
  ckpt->set_resume("latest");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "checkpoint.every: must be >= 0, got -5");
}

TEST(PlanJobErrorsTest, DeviceAndPrecision) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.set_device("cuda");
  spec.set_precision("bf16");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->spec.device(), "cuda");
  spec.set_precision("");
  plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->spec.precision(), "fp32");  // normalized
  spec.set_device("tpu");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "device: must be one of \"cpu\", \"cuda\", \"sim\", got "
                "\"tpu\"");
  spec.set_device("");
  spec.set_precision("bf16");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "precision: bf16 needs device \"cuda\" (or \"sim\"), got "
                "device \"cpu\" (the CPU computes in fp32)");
  spec.set_precision("tf32");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "precision: tf32 needs device \"cuda\", got device \"cpu\" "
                "(the CPU computes in fp32)");
  spec.set_device("sim");
  spec.set_precision("bf16");
  EXPECT_TRUE(PlanJob(spec, Options(dir)).ok());
  spec.set_precision("tf32");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "precision: tf32 needs device \"cuda\", got device \"sim\" "
                "(the CPU computes in fp32)");
  spec.set_precision("fp16");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "precision: must be one of \"fp32\", \"tf32\", \"bf16\", "
                "got \"fp16\"");
}

TEST(PlanJobErrorsTest, InitSafetensorsMissing) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->mutable_init()->set_safetensors("/nonexistent/w.st");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "model.init.safetensors: /nonexistent/w.st: no such file");
}

TEST(PlanJobTest, UncheckedFilesNeedExplicitInputWidth) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_data()->mutable_train()->mutable_npy()->set_features(
      "not/here.npy");
  PlanOptions options = Options(dir);
  options.check_files = false;
  ExpectProblem(PlanJob(spec, options),
                "model.blocks[0].in_features: cannot be inferred: the data's "
                "feature count is unknown (files not checked); set it");
  spec.mutable_model()->mutable_blocks(0)->set_in_features(8);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->feature_dim, 8);
  EXPECT_EQ(plan->spec.data().train().npy().features(), dir + "/not/here.npy");
}

TEST(PlanJobTest, AllProblemsComeBackInOneStatus) {
  const std::string dir = TestDir();
  absl::StatusOr<JobSpec> spec =
      LoadJobSpecFile("plan/testdata/bad_many_problems.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<JobPlan> plan = PlanJob(*spec, Options(dir));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      std::string(plan.status().message()),
      "invalid job spec (5 problems):\n"
      "steps: must be > 0, got 0\n"
      "precision: must be one of \"fp32\", \"tf32\", \"bf16\", got \"fp16\"\n"
      "model.blocks[0].ffn_hidden_size: must be > 0, got -4\n"
      "parallelism.schedule: must be one of \"gpipe\", \"1f1b\", \"zbh1\", "
      "\"interleaved\", \"zbv\", got "
      "\"zb\"\n"
      "optimizer.beta1: only for adamw");
}

TEST(PlanJobTest, MemoryEstimateFollowsTheDocumentedFormula) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_parallelism()->set_microbatches(2);  // b = 2
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const MemoryEstimate& m = plan->memory;
  const uint64_t n = 816 + 1104 + 163;
  EXPECT_EQ(m.params, 4 * n);
  EXPECT_EQ(m.grads, 4 * n);
  EXPECT_EQ(m.optimizer_state, 8 * n);  // AdamW: m and v
  // 1F1B, S = 2, M = 2: stage 0 holds min(2, 2) = 2 microbatches, stage 1
  // holds 1. Per sample and block, saved: in + fc1 + ffn + out (+ in + 2 with
  // a norm); backward scratch: out + fc1 + ffn + in (+ in with a norm).
  // block 0: 8+32+32+16 = 88;  bwd 16+32+32+8 = 88
  // block 1: 16+32+32+16+18 = 114; bwd 16+32+32+16+16 = 112
  // block 2: 16+8+8+3 = 35;  bwd 3+8+8+16 = 35
  // stage 0: 2 * (2 * 88 + 88); stage 1: 2 * (1 * (114 + 35) + 112)
  EXPECT_EQ(m.activations, 4u * (2 * (2 * 88 + 88) + 2 * (149 + 112)));
  EXPECT_EQ(m.data, 10u * 8 * 4 + 10u * 3 * 4);
  EXPECT_EQ(m.total, m.params + m.grads + m.optimizer_state + m.state_copies +
                         m.activations + m.data);
  EXPECT_THAT(m.description, HasSubstr("(params 8.1 KiB, grads 8.1 KiB"));
  EXPECT_EQ(m.state_copies, 0u);  // no checkpoints, no snapshots

  // A checkpoint being written holds one copy of params and optimizer
  // state; snapshots four more.
  {
    JobSpec copies = spec;
    copies.mutable_checkpoint()->set_dir(dir + "/ckpt");
    absl::StatusOr<JobPlan> p = PlanJob(copies, Options(dir));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->memory.state_copies, 12 * n);
    copies.mutable_recovery()->set_snapshot_every(5);
    p = PlanJob(copies, Options(dir));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->memory.state_copies, 5 * 12 * n);
    EXPECT_THAT(p->memory.description,
                HasSubstr("checkpoint/snapshot copies 122.1 KiB"));
  }

  // GPipe keeps all M microbatches on every stage.
  spec.mutable_parallelism()->set_schedule("gpipe");
  plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->memory.activations,
            4u * (2 * (2 * 88 + 88) + 2 * (2 * 149 + 112)));
}

TEST(PlanJobTest, SpecsOverTheSizeLimitsAreRefusedNamingFieldAndLimit) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.set_name(std::string(300, 'n'));
  spec.mutable_checkpoint()->set_dir(std::string(5000, 'd'));
  for (int i = 0; i < 2000; ++i)
    *spec.mutable_model()->add_blocks() = spec.model().blocks(0);
  spec.mutable_optimizer()->add_no_decay(std::string(1000, 'x'));
  google::protobuf::Struct* config = spec.mutable_task()->mutable_config();
  for (int i = 0; i < 20; ++i) {
    config = (*config->mutable_fields())["deeper"].mutable_struct_value();
  }
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(plan.status().message());
  for (const char* part :
       {"name: 300 bytes, limit 256", "checkpoint.dir: 5000 bytes, limit 4096",
        "model.blocks: 2003 blocks, limit 1024",
        "optimizer.no_decay[0]: 1000 bytes, limit 256",
        "task.config: nested 21 levels deep, limit 16"}) {
    EXPECT_THAT(msg, HasSubstr(part)) << msg;
  }
  // Nothing long is echoed back.
  EXPECT_LT(msg.size(), 1000u) << msg;

  // A whole spec over 1 MiB.
  JobSpec big = ValidNpySpec(dir);
  (*big.mutable_task()->mutable_config()->mutable_fields())["blob"]
      .set_string_value(std::string(2 << 20, 'b'));
  plan = PlanJob(big, Options(dir));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("(spec): "));
  EXPECT_THAT(plan.status().message(), HasSubstr("limit 1048576"));
  EXPECT_LT(plan.status().message().size(), 1000u);
}

TEST(PlanJobTest, ErrorsQuoteOnlyAShortPrefixAndListAtMost50Problems) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.set_precision(std::string(200, 'p'));
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(),
              HasSubstr("\"" + std::string(64, 'p') + "...\" (200 bytes)"));
  EXPECT_LT(plan.status().message().size(), 600u);

  JobSpec many = ValidNpySpec(dir);
  for (int i = 0; i < 200; ++i) {
    auto* b = many.mutable_model()->add_blocks();
    b->set_out_features(-1);
  }
  plan = PlanJob(many, Options(dir));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("... and "));
  EXPECT_THAT(plan.status().message(), HasSubstr(" more"));
  EXPECT_LT(plan.status().message().size(), 8000u);
}

TEST(PlanJobTest, ConfinedPathsMustStayInsideTheDataFolder) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  PlanOptions options = Options(dir);
  options.confine_to = dir;
  // Inside: accepted (relative, absolute, a checkpoint folder not yet made).
  spec.mutable_checkpoint()->set_dir("ckpt/new");
  ASSERT_TRUE(PlanJob(spec, options).ok());
  spec.mutable_data()->mutable_train()->mutable_npy()->set_features(
      dir + "/data/x.npy");
  ASSERT_TRUE(PlanJob(spec, options).ok());

  // Escapes: "..", an absolute path elsewhere, a symlink pointing out.
  ASSERT_EQ(symlink("/etc", (dir + "/data/etc").c_str()), 0);
  spec.mutable_data()->mutable_train()->mutable_npy()->set_features(
      "../outside.npy");
  spec.mutable_data()->mutable_train()->mutable_npy()->set_targets(
      "data/etc/passwd");
  spec.mutable_model()->mutable_init()->set_safetensors("/etc/passwd");
  spec.mutable_checkpoint()->set_dir("/tmp/elsewhere");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, options);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(plan.status().message());
  for (const char* field :
       {"data.train.npy.features: \"../outside.npy\" resolves to",
        "data.train.npy.targets: \"data/etc/passwd\" resolves to "
        "\"/etc/passwd\"",
        "model.init.safetensors: \"/etc/passwd\" resolves to",
        "checkpoint.dir: \"/tmp/elsewhere\" resolves to"}) {
    EXPECT_THAT(msg, HasSubstr(field)) << msg;
  }
  EXPECT_THAT(msg, HasSubstr("outside the data folder"));
  // Nothing of /etc/passwd was read: no header complaint.
  EXPECT_THAT(msg, Not(HasSubstr("header"))) << msg;

  // Without confine_to (trainyard train), the same spec is only checked.
  options.confine_to.clear();
  plan = PlanJob(spec, options);
  EXPECT_THAT(std::string(plan.status().message()),
              Not(HasSubstr("outside the data folder")));
}

TEST(PlanJobTest, SpecOverTheMemoryLimitIsRejectedWithTheEstimate) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  PlanOptions options = Options(dir);
  options.memory_limit_bytes = 20000;
  absl::StatusOr<JobPlan> plan = PlanJob(spec, options);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(plan.status().message()),
              ::testing::MatchesRegex(
                  "job needs an estimated 39.8 KiB \\(params 8.1 KiB, "
                  "grads 8.1 KiB, optimizer state 16.3 KiB, activations "
                  "6.8 KiB, data 440 B\\) but the memory limit is 19.5 "
                  "KiB"));
  // The machine's own memory (limit 0) holds this small job.
  options.memory_limit_bytes = 0;
  EXPECT_TRUE(PlanJob(spec, options).ok());
}

TEST(ParseJobSpecTest, UnknownFieldNamesTheSource) {
  absl::StatusOr<JobSpec> spec =
      LoadJobSpecFile("plan/testdata/bad_unknown_field.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("plan/testdata/bad_unknown_field.json: invalid "
                        "job spec JSON: "));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("activaton"));
}

TEST(ParseJobSpecTest, WrongTypeAndBadJson) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpecJson(R"({"steps": "many"})", "inline.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("inline.json: invalid job spec JSON: "));
  spec = ParseJobSpecJson("{\"steps\": 3", "cut.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("cut.json: "));
}

TEST(ParseJobSpecTest, AcceptsBothFieldNameStyles) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpecJson(R"({"data": {"batch_size": 3, "evalEvery": 2}})", "x");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().batch_size(), 3);
  EXPECT_EQ(spec->data().eval_every(), 2);
}

TEST(ParseJobSpecTest, MissingFileIsNotFound) {
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile("/nonexistent/spec.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("/nonexistent/spec.json"));
}

}  // namespace
}  // namespace trainyard
