// The largest microbatch (in rows) whose weight GEMMs the MLP block runs on
// the packed GEMM (kernels/packed_gemm.h), on its own so that the planner's
// memory estimate can count the packs without linking the kernels.
#ifndef TRAINYARD_KERNELS_PACKED_GEMM_ROWS_H_
#define TRAINYARD_KERNELS_PACKED_GEMM_ROWS_H_

#include <cstdint>

namespace trainyard {

// The limit on CPUs with AVX-512 (PackedGemmMaxRows() in packed_gemm.h
// says which this CPU has). The planner, which does not know its workers'
// CPUs, counts packs and chained weight passes up to this many rows.
//
// Measured on AMD Zen 4 (AVX-512 on 256-bit units) against OpenBLAS's
// Haswell kernels (docs/BENCHMARKS.md, "The packed GEMM at 256 rows"): with
// one microbatch of 256 rows, the forward packing each weight as it goes and
// keeping the pack for the input gradient, and the weight gradient on the
// packed GEMM, the step ran at 92.3% and, an hour later, 89.6% of the
// SGEMM ceiling against 88.7% on OpenBLAS (medians of the same 12 rounds
// each). On an Intel Xeon with full-width AVX-512 the AVX-512 kernel took
// 5-6% less time than OpenBLAS's SkylakeX kernels at 256 rows (the GEMMs
// alone).
inline constexpr int64_t kPackedGemmMaxRows = 256;

// The limit on the other CPUs (AVX2 and FMA, no AVX-512). Measured on 2
// threads, AVX2 (docs/BENCHMARKS.md, "A packed GEMM for small
// microbatches"): with each weight packed once a step and a step's weight
// gradients chained, the packed GEMM took 5-35% less time than OpenBLAS,
// which packs the weights inside every call, at 32 and 64 rows; at 128
// rows 4-7% less for the forward and input-gradient GEMMs and the same for
// the weight gradients; at 256 rows (one microbatch, no packs kept then)
// the two were even. With one microbatch's packs kept for its input
// gradients, the AVX2 kernel lost at 256 rows on Zen 4 forced to run it:
// the step's share of the ceiling 0.875-0.878 against OpenBLAS's
// 0.887-0.899 ("The packed GEMM at 256 rows"); not measured on an
// AVX2-only CPU.
inline constexpr int64_t kPackedGemmMaxRowsAvx2 = 128;

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_PACKED_GEMM_ROWS_H_
