// Where the packed GEMM runs (kernels/packed_gemm.h; this test turns it on
// whatever the CPU), a CPU stage's first microbatch packs each weight and
// the step's other microbatches read the packs, which the stage drops
// before its optimizer step changes the weights (and an eval packs anew):
// the same bits as packing in every GEMM, over steps, evals, stage splits
// and schedules. Packs kept across an optimizer step would change them.
#include "engine/test_jobs.h"
#include "gtest/gtest.h"
#include "kernels/block_kernel.h"
#include "kernels/packed_gemm.h"

namespace trainyard {
namespace {

using testing::ClassificationSpec;
using testing::RunJob;
using testing::RunResult;
using testing::WithPipeline;

TEST(PackedWeightsTest, KeptPacksAreBitwiseThePackingInEveryGemm) {
  // Batch 32 in 4 microbatches of 8 rows, evals every 10 of 30 steps.
  ASSERT_TRUE(UsePackedGemm(8)) << "TRAINYARD_PACKED_GEMM=1 expected";
  for (int stages : {1, 2}) {
    for (const char* schedule : {"1f1b", "zbh1"}) {
      SCOPED_TRACE(::testing::Message() << "S=" << stages << " " << schedule);
      const auto spec = WithPipeline(ClassificationSpec(), stages, 4, schedule);
      KeepPackedWeightsForTesting(false);
      const RunResult fresh = RunJob(spec);
      KeepPackedWeightsForTesting(true);
      const RunResult kept = RunJob(spec);
      ASSERT_TRUE(fresh.status.ok()) << fresh.status;
      ASSERT_TRUE(kept.status.ok()) << kept.status;
      ASSERT_EQ(kept.losses.size(), 30u);
      EXPECT_EQ(kept.losses, fresh.losses);  // exact
      EXPECT_EQ(kept.grad_norms, fresh.grad_norms);
      EXPECT_EQ(kept.eval_loss, fresh.eval_loss);
      EXPECT_EQ(kept.params, fresh.params);
    }
  }
}

}  // namespace
}  // namespace trainyard
