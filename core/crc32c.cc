#include "core/crc32c.h"

#include <array>
#include <cstring>

#include "core/unaligned.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace trainyard {
namespace {

// CRC32C tables for slicing-by-8, reflected polynomial 0x82F63B78.
struct Crc32cTables {
  std::array<std::array<uint32_t, 256>, 8> t;
  Crc32cTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s)
        t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

const Crc32cTables& Tables() {
  static const Crc32cTables* tables = new Crc32cTables();
  return *tables;
}

#if defined(__x86_64__)
// Three independent CRC streams keep the crc32 instruction's pipeline full
// (latency 3, throughput 1); their results are combined by shifting a
// stream's state over the kStride zero bytes that follow it.
constexpr size_t kStride = 8192;

__attribute__((target("sse4.2"))) uint64_t CrcZeros(uint64_t state, size_t n) {
  for (size_t i = 0; i < n; i += 8) state = _mm_crc32_u64(state, 0);
  return state;
}

// shift[k][b]: the raw CRC state b << 8k after kStride zero bytes (the map
// is linear, so four lookups shift any state).
struct ShiftTables {
  std::array<std::array<uint32_t, 256>, 4> shift;
  ShiftTables() {
    uint32_t basis[32];
    for (int j = 0; j < 32; ++j) {
      basis[j] = static_cast<uint32_t>(CrcZeros(uint32_t{1} << j, kStride));
    }
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int i = 0; i < 8; ++i) {
          if (b & (1u << i)) v ^= basis[8 * k + i];
        }
        shift[k][b] = v;
      }
    }
  }
  uint32_t Shift(uint32_t s) const {
    return shift[0][s & 0xff] ^ shift[1][(s >> 8) & 0xff] ^
           shift[2][(s >> 16) & 0xff] ^ shift[3][s >> 24];
  }
};

const ShiftTables& Shifts() {
  static const ShiftTables* tables = new ShiftTables();
  return *tables;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(uint32_t crc,
                                                          const void* data,
                                                          size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  if (n >= 3 * kStride) {
    const ShiftTables& shifts = Shifts();
    while (n >= 3 * kStride) {
      const char* a = reinterpret_cast<const char*>(p);
      uint64_t c1 = 0, c2 = 0;
      for (size_t i = 0; i < kStride; i += 8) {
        c = _mm_crc32_u64(c, LoadUnaligned<uint64_t>(a + i));
        c1 = _mm_crc32_u64(c1, LoadUnaligned<uint64_t>(a + kStride + i));
        c2 = _mm_crc32_u64(c2, LoadUnaligned<uint64_t>(a + 2 * kStride + i));
      }
      c = shifts.Shift(static_cast<uint32_t>(c)) ^ c1;
      c = shifts.Shift(static_cast<uint32_t>(c)) ^ c2;
      p += 3 * kStride;
      n -= 3 * kStride;
    }
  }
  while (n >= 8) {
    c = _mm_crc32_u64(
        c, LoadUnaligned<uint64_t>(reinterpret_cast<const char*>(p)));
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  return ~static_cast<uint32_t>(c);
}

bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n) {
  const auto& t = Tables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    const uint32_t lo =
        LoadUnaligned<uint32_t>(reinterpret_cast<const char*>(p)) ^ c;
    const uint32_t hi =
        LoadUnaligned<uint32_t>(reinterpret_cast<const char*>(p) + 4);
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^
        t[4][lo >> 24] ^ t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^
        t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return ~c;
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (HaveSse42()) return Crc32cHardware(crc, data, n);
#endif
  return Crc32cExtendPortable(crc, data, n);
}

}  // namespace trainyard
