// Where the packed GEMM runs (kernels/packed_gemm.h; this test turns it on
// whatever the CPU), a CPU stage's first microbatch packs each weight and
// the step's other GEMMs read the packs (the input gradients too), which the
// stage drops before its optimizer step changes the weights (and an eval packs
// anew): the same bits as packing in every GEMM, over steps, evals, stage
// splits and schedules. Packs kept across an optimizer step would change them.
// Its weight gradients chain exactly: a one-stage job that runs them all at
// the end of the step gets the bits of running one a microbatch.
#include <map>

#include "engine/stage_report.h"
#include "engine/test_jobs.h"
#include "gtest/gtest.h"
#include "kernels/block_kernel.h"
#include "kernels/mlp_block.h"
#include "kernels/packed_gemm.h"

namespace trainyard {
namespace {

using testing::ClassificationSpec;
using testing::RunJob;
using testing::RunResult;
using testing::WithPipeline;

TEST(PackedWeightsTest, KeptPacksAreBitwiseThePackingInEveryGemm) {
  // Batch 32 in 4 microbatches of 8 rows, or one of 32 (whose input
  // gradients read what its forward packed), evals every 10 of 30 steps.
  ASSERT_TRUE(UsePackedGemm(32)) << "TRAINYARD_PACKED_GEMM=1 expected";
  struct Layout {
    int stages, microbatches;
    const char* schedule;
  };
  for (const Layout& l :
       {Layout{1, 4, "1f1b"}, Layout{1, 4, "zbh1"}, Layout{2, 4, "1f1b"},
        Layout{2, 4, "zbh1"}, Layout{1, 1, "1f1b"}, Layout{2, 1, "1f1b"}}) {
    SCOPED_TRACE(::testing::Message() << "S=" << l.stages << " M="
                                      << l.microbatches << " " << l.schedule);
    const auto spec = WithPipeline(ClassificationSpec(), l.stages,
                                   l.microbatches, l.schedule);
    KeepPackedWeightsForTesting(false);
    int64_t reads = KeptPackReadsForTesting();
    const RunResult fresh = RunJob(spec);
    EXPECT_EQ(KeptPackReadsForTesting(), reads) << "packs kept";
    KeepPackedWeightsForTesting(true);
    const RunResult kept = RunJob(spec);
    // Without evals (whose later microbatches read packs too), every step
    // reads packs: at least fc1's and fc2's of one block, in the input
    // gradients (and later microbatches' forwards).
    auto no_evals = spec;
    no_evals.mutable_data()->set_eval_every(0);
    reads = KeptPackReadsForTesting();
    ASSERT_TRUE(RunJob(no_evals).status.ok());
    EXPECT_GE(KeptPackReadsForTesting() - reads, 2 * 30) << "packs not kept";
    ASSERT_TRUE(fresh.status.ok()) << fresh.status;
    ASSERT_TRUE(kept.status.ok()) << kept.status;
    ASSERT_EQ(kept.losses.size(), 30u);
    EXPECT_EQ(kept.losses, fresh.losses);  // exact
    EXPECT_EQ(kept.grad_norms, fresh.grad_norms);
    EXPECT_EQ(kept.eval_loss, fresh.eval_loss);
    EXPECT_EQ(kept.params, fresh.params);
  }
}

// The backward-weight spans of one stage's first step: (microbatch, count).
std::map<int, int> WeightSpans(const RunResult& r, int stage) {
  std::map<int, int> spans;
  for (const Span& span : r.stage_reports.at(stage).at(0).trace.spans) {
    if (span.kind == v1::SPAN_BACKWARD_WEIGHT) ++spans[span.microbatch];
  }
  return spans;
}

// A CPU job of one stage runs its weight passes at the step's end, its
// microbatches chained into one accumulation per weight (one span of no
// microbatch); two stages run one pass a microbatch where the schedule
// puts it. The packed GEMM's weight gradients make them the same bits.
TEST(PackedWeightsTest, ChainedWeightPassesAreBitwiseOnePassAMicrobatch) {
  ASSERT_TRUE(UsePackedGemm(8)) << "TRAINYARD_PACKED_GEMM=1 expected";
  for (const char* schedule : {"gpipe", "1f1b", "zbh1"}) {
    SCOPED_TRACE(schedule);
    const RunResult one =
        RunJob(WithPipeline(ClassificationSpec(), 1, 4, schedule));
    const RunResult two =
        RunJob(WithPipeline(ClassificationSpec(), 2, 4, schedule));
    ASSERT_TRUE(one.status.ok()) << one.status;
    ASSERT_TRUE(two.status.ok()) << two.status;
    EXPECT_EQ(WeightSpans(one, 0), (std::map<int, int>{{-1, 1}}));
    const std::map<int, int> each = {{0, 1}, {1, 1}, {2, 1}, {3, 1}};
    EXPECT_EQ(WeightSpans(two, 0), each);
    EXPECT_EQ(WeightSpans(two, 1), each);
    ASSERT_EQ(one.losses.size(), 30u);
    EXPECT_EQ(one.losses, two.losses);  // exact
    EXPECT_EQ(one.grad_norms, two.grad_norms);
    EXPECT_EQ(one.eval_loss, two.eval_loss);
    EXPECT_EQ(one.params, two.params);
  }
}

}  // namespace
}  // namespace trainyard
