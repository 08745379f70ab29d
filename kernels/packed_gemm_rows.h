// The largest microbatch (in rows) whose weight GEMMs the MLP block runs on
// the packed GEMM (kernels/packed_gemm.h), on its own so that the planner's
// memory estimate can count the packs without linking the kernels.
#ifndef TRAINYARD_KERNELS_PACKED_GEMM_ROWS_H_
#define TRAINYARD_KERNELS_PACKED_GEMM_ROWS_H_

#include <cstdint>

namespace trainyard {

// Below 64 rows OpenBLAS, packing the weights inside every call, was
// measured 11-24% slower than the packed GEMM with weights packed once a
// step; at 64 and 256 rows it was 6-17% faster (docs/BENCHMARKS.md, 2
// threads, AVX2). The choice depends on the row count only, so every
// layout of a job (stages, replicas, schedule) makes the same one.
inline constexpr int64_t kPackedGemmMaxRows = 63;

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_PACKED_GEMM_ROWS_H_
