// Reader and writer for the .npy files numpy writes (format versions 1.0,
// 2.0 and 3.0): little-endian float32, int32 or int64, C order. Two 2-byte
// float types only where the caller opts in (NpyReadOptions), since most
// readers cannot hold them: float16 ('<f2') and bfloat16, which numpy cannot
// name, stored as 2-byte words ('<u2', or '|V2' / '<V2' as numpy saves an
// ml_dtypes.bfloat16 array). Functions share no state and are thread-safe.
//
// Every error names the file and what is wrong with it, e.g.
//   data/x.npy: dtype '<f8' is not supported (expected <f4, <i4 or <i8)
//   data/x.npy: truncated: header promises 4096 bytes of data, file has 100
#ifndef TRAINYARD_CORE_NPY_H_
#define TRAINYARD_CORE_NPY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace trainyard {

struct NpyHeader {
  // The stored element type: kFloat32, kInt32, kInt64, or, where the
  // options allow them, kFloat16 and kBFloat16 (2 bytes an element).
  DType dtype = DType::kFloat32;
  std::string descr;  // as the file spells it: "<f4", "<u2", "|V2", ...
  Shape shape;
  size_t data_offset = 0;  // bytes from the start of the file
};

struct NpyReadOptions {
  bool float16 = false;  // accept '<f2' (dtype kFloat16)
  // Accept '<u2', '|V2' and '<V2' as bfloat16 words (dtype kBFloat16). Only
  // the caller knows that a file of 2-byte words holds bfloat16 values.
  bool bfloat16_words = false;
};

// Parses only the header (cheap; used by spec validation). Checks the magic,
// version, dtype, fortran_order == False and that the file's size is exactly
// the header's plus the data's (InvalidArgument naming the file otherwise;
// NotFound when it does not exist). A 2-byte dtype the options do not allow
// is refused like any other unsupported dtype.
absl::StatusOr<NpyHeader> ReadNpyHeader(const std::string& path,
                                        const NpyReadOptions& options = {});

// The IEEE 754 half-precision value with bits `bits` as a float32: exact
// (every half is a float), subnormals, infinities and NaN payloads included.
float Float16ToFloat(uint16_t bits);

// `f` rounded to the nearest half, ties to even, as numpy's
// astype(np.float16) does: beyond the largest half (65504) by half an ulp
// or more is infinity; below the smallest subnormal rounds to (signed)
// zero; NaN stays NaN (keeping the payload's top bits).
uint16_t FloatToFloat16(float f);

// Reads the whole array (float32, int32 or int64; not the 2-byte types).
absl::StatusOr<Tensor> ReadNpy(const std::string& path);

// The bytes of a version 1.0 .npy header for an array of `dtype` (float32,
// int32, int64, float16 as '<f2' or bfloat16 as '<u2' words) and `shape`, as
// numpy writes it: padded with spaces so the data starts at a multiple of
// 64 bytes, and at least `min_bytes` in (a writer that streams rows before
// it knows their count reserves that much). InvalidArgument for another
// dtype or a header over 64 KiB.
absl::StatusOr<std::string> NpyHeaderBytes(DType dtype, const Shape& shape,
                                           size_t min_bytes = 0);

// Writes `tensor` (a dtype NpyHeaderBytes takes) as a version 1.0 .npy file.
absl::Status WriteNpy(const std::string& path, const Tensor& tensor);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_NPY_H_
