// The largest microbatch (in rows) whose weight GEMMs the MLP block runs on
// the packed GEMM (kernels/packed_gemm.h), on its own so that the planner's
// memory estimate can count the packs without linking the kernels.
#ifndef TRAINYARD_KERNELS_PACKED_GEMM_ROWS_H_
#define TRAINYARD_KERNELS_PACKED_GEMM_ROWS_H_

#include <cstdint>

namespace trainyard {

// Measured on 2 threads, AVX2 (docs/BENCHMARKS.md): at 32 and 64 rows the
// packed GEMM, with weights packed once a step and a step's weight
// gradients chained, took 5-35% less time than OpenBLAS, which packs the
// weights inside every call; at 128 rows its forward and input-gradient
// GEMMs were 6% slower. The choice depends on the row count only, so every
// layout of a job (stages, replicas, schedule) makes the same one.
inline constexpr int64_t kPackedGemmMaxRows = 64;

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_PACKED_GEMM_ROWS_H_
