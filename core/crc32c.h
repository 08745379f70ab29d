// CRC32C (Castagnoli): the frames' and checkpoints' checksum, and
// TensorBoard's record checksum (masked there).
#ifndef TRAINYARD_CORE_CRC32C_H_
#define TRAINYARD_CORE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace trainyard {

// Extends `crc` (start with 0) by `n` bytes. Uses the SSE4.2 instruction
// when the CPU has it, else a table.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
// The table version, for tests against the hardware one.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_CRC32C_H_
