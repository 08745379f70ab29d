// What the CPU kernels ask of the CPU they run on, in one place: OpenBLAS's
// core type (kernels/blas.cc) and the packed GEMM's default and kernel
// (kernels/packed_gemm_kernels.cc) are chosen from these.
#ifndef TRAINYARD_KERNELS_CPU_KIND_H_
#define TRAINYARD_KERNELS_CPU_KIND_H_

namespace trainyard {

// AVX2 and FMA (Haswell and later, AMD Zen and later).
bool CpuHasAvx2Fma();

// The AVX-512 subsets OpenBLAS's SkylakeX kernels use (F, BW, DQ, VL).
bool CpuHasAvx512();

// AVX-512 executed on 256-bit FMA units, two halves an instruction, so that
// 512-bit code has no more FMA throughput than AVX2 code: AMD's family 25
// with AVX-512 (Zen 4). On this CPU OpenBLAS's AVX2 (Haswell) kernels ran
// 6% faster than its SkylakeX ones at 256 rows and 20-35% faster at 32 to
// 64 rows (docs/BENCHMARKS.md, "The CPU step by parts").
bool CpuHasHalfWidthAvx512();

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CPU_KIND_H_
