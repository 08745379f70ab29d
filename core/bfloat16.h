// bfloat16 on the host: the float32 <-> bfloat16 conversions CUDA's
// cuda_bf16.h performs (__float2bfloat16_rn: round to nearest even, any NaN
// becomes the canonical 0x7FFF; widening is exact), for code that handles
// bfloat16 tensors on the CPU (the simulated device, tests, references).
#ifndef TRAINYARD_CORE_BFLOAT16_H_
#define TRAINYARD_CORE_BFLOAT16_H_

#include <cstdint>
#include <cstring>

namespace trainyard {

inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;  // NaN
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace trainyard

#endif  // TRAINYARD_CORE_BFLOAT16_H_
