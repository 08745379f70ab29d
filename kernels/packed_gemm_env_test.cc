// TRAINYARD_PACKED_GEMM as the process reads it once: each test target
// (kernels/BUILD.bazel) sets another value.
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cpu_kind.h"
#include "kernels/packed_gemm.h"

namespace trainyard {
namespace {

// The kernel a CPU like this one runs when the variable names none.
PackedKernel CpuDefault() {
  if (!CpuHasAvx2Fma()) return PackedKernel::kPortable;
  return CpuHasAvx512() ? PackedKernel::kAvx512 : PackedKernel::kAvx2;
}

TEST(PackedGemmEnvTest, TheVariableTurnsItOnOrOffAndPicksTheKernel) {
  const char* raw = std::getenv("TRAINYARD_PACKED_GEMM");
  ASSERT_NE(raw, nullptr) << "the test target sets TRAINYARD_PACKED_GEMM";
  const std::string env = raw;
  if (env == "0") {
    EXPECT_FALSE(PackedGemmEnabled());
    EXPECT_FALSE(UsePackedGemm(32));
    EXPECT_EQ(PackedGemmDescription(), "packed GEMM: off");
    return;
  }
  EXPECT_TRUE(PackedGemmEnabled());
  // The row limit follows the CPU, whichever kernel the variable picks.
  const int64_t max_rows =
      CpuHasAvx512() ? kPackedGemmMaxRows : kPackedGemmMaxRowsAvx2;
  EXPECT_EQ(PackedGemmMaxRows(), max_rows);
  EXPECT_TRUE(UsePackedGemm(max_rows));
  EXPECT_FALSE(UsePackedGemm(max_rows + 1));
  PackedKernel want = CpuDefault();
  if (env == "portable") want = PackedKernel::kPortable;
  // Named but not on this CPU: the CPU's own kernel.
  if (env == "avx512" && PackedKernelSupported(PackedKernel::kAvx512)) {
    want = PackedKernel::kAvx512;
  }
  EXPECT_EQ(ActivePackedKernel(), want)
      << PackedKernelName(ActivePackedKernel());
  EXPECT_EQ(PackedGemmDescription(), std::string("packed GEMM: ") +
                                         PackedKernelName(want) + ", up to " +
                                         std::to_string(max_rows) + " rows");
  SetPackedKernelForTesting(PackedKernel::kPortable);
  EXPECT_EQ(ActivePackedKernel(), PackedKernel::kPortable);
  SetPackedKernelForTesting(std::nullopt);
  EXPECT_EQ(ActivePackedKernel(), want);
}

}  // namespace
}  // namespace trainyard
