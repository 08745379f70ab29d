#include "kernels/cpu_kind.h"

#include <cpuid.h>

namespace trainyard {
namespace {

// CPUID's display family (base family, plus the extended family when the
// base is 0xf), 0 if CPUID has no leaf 1.
unsigned CpuFamily() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return 0;
  const unsigned base = (eax >> 8) & 0xf;
  return base == 0xf ? base + ((eax >> 20) & 0xff) : base;
}

}  // namespace

bool CpuHasAvx2Fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool CpuHasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
}

bool CpuHasHalfWidthAvx512() {
  // CpuHasAvx512 runs __builtin_cpu_init before __builtin_cpu_is reads.
  return CpuHasAvx512() && __builtin_cpu_is("amd") && CpuFamily() == 25;
}

}  // namespace trainyard
