// The largest microbatch (in rows) whose weight GEMMs the MLP block runs on
// the packed GEMM (kernels/packed_gemm.h), on its own so that the planner's
// memory estimate can count the packs without linking the kernels.
#ifndef TRAINYARD_KERNELS_PACKED_GEMM_ROWS_H_
#define TRAINYARD_KERNELS_PACKED_GEMM_ROWS_H_

#include <cstdint>

namespace trainyard {

// Measured on 2 threads, AVX2 (docs/BENCHMARKS.md, "A packed GEMM for small
// microbatches"): with each weight packed once a step (W^T, read by the
// forward and the input gradient) and a step's weight gradients chained,
// the packed GEMM took 5-35% less time than OpenBLAS, which packs the
// weights inside every call, at 32 and 64 rows; at 128 rows 4-7% less for
// the forward and input-gradient GEMMs and the same for the weight
// gradients. At 256 rows (one microbatch of the benchmark's batch, whose
// packs nobody else reads) the two were even, so OpenBLAS keeps those.
// On AMD Zen 4 (AVX-512 on 256-bit units) against OpenBLAS's Haswell
// kernels: 7-14% less time at 32 and 64 rows on the forward and input
// gradients and 13-14% less on the chained weight gradients at 32; at 128
// rows 2-7% less and 5% more; at 256 rows even (0.986-1.041). On an
// Intel Xeon (full-width AVX-512) against OpenBLAS's SkylakeX kernels, the
// AVX-512 kernel took 5-6% less at 256 rows too; a larger limit there is
// not measured in a step.
// The choice depends on the row count only, so every layout of a job
// (stages, replicas, schedule) makes the same one.
inline constexpr int64_t kPackedGemmMaxRows = 128;

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_PACKED_GEMM_ROWS_H_
