// The memory estimate and the memory limit.
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/packed_gemm_rows.h"
#include "plan/job_plan.h"
#include "plan/plan_test_util.h"

namespace trainyard {
namespace plan_test {
namespace {

using ::testing::HasSubstr;
using trainyard::v1::JobSpec;

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
  // A CPU job with microbatches of 2 rows keeps each fc weight [r, c]
  // packed once, as W^T: 4 * c * pad16(r) bytes:
  // block 0: fc1 [32, 8] 4*8*32, fc2 [16, 32] 4*32*16
  // block 1: fc1 [32, 16] 4*16*32, fc2 [16, 32] as block 0's
  // block 2: fc1 [8, 16] 4*16*16, fc2 [3, 8] 4*8*16
  EXPECT_EQ(m.packed_weights, 1024u + 2048 + 2048 + 2048 + 1024 + 512);
  EXPECT_THAT(m.description, HasSubstr("packed weights 8.5 KiB"));
  EXPECT_EQ(m.total, m.params + m.grads + m.optimizer_state + m.state_copies +
                         m.activations + m.packed_weights + m.data);
  EXPECT_THAT(m.description, HasSubstr("(params 8.1 KiB, grads 8.1 KiB"));
  EXPECT_EQ(m.state_copies, 0u);  // no checkpoints, no snapshots

  // The same packs for one microbatch a step (its input gradients read
  // what its forward packed) and for microbatches of kPackedGemmMaxRows
  // (256) rows; none for kPackedGemmMaxRows + 1 rows.
  for (const auto& [batch, microbatches, packed] :
       {std::tuple<int64_t, int, uint64_t>{10, 1, m.packed_weights},
        {2 * kPackedGemmMaxRows, 2, m.packed_weights},
        {2 * (kPackedGemmMaxRows + 1), 2, 0}}) {
    JobSpec other = spec;
    other.mutable_data()->set_batch_size(batch);
    other.mutable_parallelism()->set_microbatches(microbatches);
    absl::StatusOr<JobPlan> p = PlanJob(other, Options(dir));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->memory.packed_weights, packed) << batch << "/" << microbatches;
  }
  // The simulated device's blocks are the CPU's, packs included; CUDA's
  // keep none.
  for (const auto& [device, packed] :
       {std::pair<const char*, uint64_t>{"sim", m.packed_weights},
        {"cuda", 0}}) {
    JobSpec other = spec;
    other.set_device(device);
    absl::StatusOr<JobPlan> p = PlanJob(other, Options(dir));
    ASSERT_TRUE(p.ok()) << device << ": " << p.status();
    EXPECT_EQ(p->memory.packed_weights, packed) << device;
  }

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

// Accumulation "tree" holds floor(log2 m) + 1 gradient-sized partial sums
// (m = M / R microbatches per replica), none when m = 1: the tree of one
// gradient is the gradient itself.
TEST(PlanJobTest, TreeBuffersFollowTheMicrobatchesPerReplica) {
  const std::string dir = TestDir();
  const uint64_t grads = 4 * (816 + 1104 + 163);
  struct Case {
    int microbatches, replicas;
    uint64_t buffers;
  };
  for (const Case& c : {Case{1, 1, 0}, Case{2, 1, 2}, Case{4, 1, 3},
                        Case{2, 2, 0}, Case{4, 2, 2}}) {
    JobSpec spec = ValidNpySpec(dir);
    spec.mutable_data()->set_batch_size(8);
    spec.mutable_parallelism()->set_accumulation("tree");
    spec.mutable_parallelism()->set_microbatches(c.microbatches);
    spec.mutable_parallelism()->set_replicas(c.replicas);
    absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->memory.grads, grads * (1 + c.buffers))
        << "M=" << c.microbatches << " R=" << c.replicas;
  }
}

// A CPU job of one stage with several microbatches of at most
// kPackedGemmMaxRows (256) rows and sequential accumulation runs its weight
// passes at the end of the step (ChainsWeightPasses): it holds all its
// microbatches, whatever the schedule.
TEST(PlanJobTest, ChainedWeightPassesHoldEveryMicrobatch) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_parallelism()->set_stages(1);
  spec.mutable_parallelism()->set_microbatches(4);  // b = 1
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(ChainsWeightPasses(*plan));
  // The blocks of MemoryEstimateFollowsTheDocumentedFormula on one stage:
  // saved 88 + 149 per sample, backward scratch 112; 4 microbatches held
  // instead of 1F1B's 1.
  EXPECT_EQ(plan->memory.activations, 4u * (4 * 237 + 112));

  // Not chained: accumulation "tree", one microbatch, two stages, or
  // microbatches of kPackedGemmMaxRows + 1 rows.
  const auto not_chained = [&](JobSpec other, const char* what) -> uint64_t {
    absl::StatusOr<JobPlan> p = PlanJob(other, Options(dir));
    EXPECT_TRUE(p.ok()) << what << ": " << p.status();
    if (!p.ok()) return 0;
    EXPECT_FALSE(ChainsWeightPasses(*p)) << what;
    return p->memory.activations;
  };
  JobSpec tree = spec;
  tree.mutable_parallelism()->set_accumulation("tree");
  EXPECT_EQ(not_chained(tree, "tree"), 4u * (1 * 237 + 112));
  JobSpec one = spec;
  one.mutable_parallelism()->set_microbatches(1);
  not_chained(one, "one microbatch");
  JobSpec two = spec;
  two.mutable_parallelism()->set_stages(2);
  not_chained(two, "two stages");
  JobSpec big = spec;
  big.mutable_data()->set_batch_size(2 * (kPackedGemmMaxRows + 1));
  big.mutable_parallelism()->set_microbatches(2);
  not_chained(big, "kPackedGemmMaxRows + 1 rows");
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
                  "job needs an estimated 48.3 KiB \\(params 8.1 KiB, "
                  "grads 8.1 KiB, optimizer state 16.3 KiB, activations "
                  "6.8 KiB, packed weights 8.5 KiB, data 440 B\\) but the "
                  "memory limit is 19.5 KiB"));
  // The machine's own memory (limit 0) holds this small job.
  options.memory_limit_bytes = 0;
  EXPECT_TRUE(PlanJob(spec, options).ok());
}

// The data's memory: a source held in memory counts whole; a sharded one
// counts its read-ahead (3 batches of this replica's rows, features as
// float32) and the pages one read maps; data.memory_limit_mib bounds it.
TEST(PlanJobTest, DataMemoryIsCheckedAgainstTheDataLimit) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_data()->set_memory_limit_mib(1);
  ASSERT_TRUE(PlanJob(spec, Options(dir)).ok());  // 440 B in memory

  // A synthetic source of 100000 x 8 float32 features and 3 float32
  // targets is 4.2 MiB in memory: over a 1 MiB limit.
  JobSpec big = spec;
  auto* syn = big.mutable_data()->mutable_train()->mutable_synthetic();
  syn->set_kind("teacher_regression");
  syn->set_num_samples(100000);
  syn->set_num_features(8);
  syn->set_num_outputs(3);
  ExpectProblem(PlanJob(big, Options(dir)),
                "data.memory_limit_mib: the job's data needs an estimated "
                "4.2 MiB (held in memory 4.2 MiB, read-ahead 0 B, mapped "
                "pages 0 B) but the limit is 1.0 MiB: raise it, or stream "
                "the data from npy_shards");
  big.mutable_data()->set_memory_limit_mib(0);  // the default, 512 MiB
  EXPECT_TRUE(PlanJob(big, Options(dir)).ok());
  big.mutable_data()->set_memory_limit_mib(-1);
  ExpectProblem(PlanJob(big, Options(dir)),
                "data.memory_limit_mib: must be >= 0 (0: 512), got -1");

  // The same rows as shards: 3 x 4 rows x (8 x 4 + 3 x 4) bytes read
  // ahead, and 4 rows x (one page + 64 KiB) mapped.
  JobSpec sharded = spec;
  auto* shards = sharded.mutable_data()->mutable_train()->mutable_npy_shards();
  shards->add_features("data/x.npy");
  shards->add_targets("data/y.npy");
  absl::StatusOr<JobPlan> plan = PlanJob(sharded, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->memory.data, 3u * 4 * (8 * 4 + 3 * 4) + 4u * (4096 + 65536));
}

}  // namespace
}  // namespace plan_test
}  // namespace trainyard
