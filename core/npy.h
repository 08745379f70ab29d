// Reader and writer for the .npy files numpy writes (format versions 1.0,
// 2.0 and 3.0): little-endian float32, int32 or int64, C order; float16
// ('<f2') headers only where the caller opts in (NpyReadOptions), since no
// Tensor dtype holds it: such data is widened to float32 by its reader
// (Float16ToFloat). Functions share no state and are thread-safe.
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
  // For a float16 file, kFloat32: the type its values widen to.
  DType dtype = DType::kFloat32;
  Shape shape;
  size_t data_offset = 0;  // bytes from the start of the file
  bool float16 = false;    // the data is '<f2' (2 bytes an element)
};

struct NpyReadOptions {
  // Accept '<f2' data (reported as dtype kFloat32 with `float16` set).
  bool float16 = false;
};

// Parses only the header (cheap; used by spec validation). Checks the magic,
// version, dtype, fortran_order == False and that the file's size is exactly
// the header's plus the data's (InvalidArgument naming the file otherwise;
// NotFound when it does not exist). Without `options.float16`, '<f2' is
// refused like any other unsupported dtype.
absl::StatusOr<NpyHeader> ReadNpyHeader(const std::string& path,
                                        const NpyReadOptions& options = {});

// The IEEE 754 half-precision value with bits `bits` as a float32: exact
// (every half is a float), subnormals, infinities and NaN payloads included.
float Float16ToFloat(uint16_t bits);

// Reads the whole array (float32, int32 or int64; not float16).
absl::StatusOr<Tensor> ReadNpy(const std::string& path);

// The bytes of a version 1.0 .npy header for an array of `dtype` (float32,
// int32 or int64) and `shape`, as numpy writes it: padded with spaces so the
// data starts at a multiple of 64 bytes, and at least `min_bytes` in (a
// writer that streams rows before it knows their count reserves that much).
// InvalidArgument for another dtype or a header over 64 KiB.
absl::StatusOr<std::string> NpyHeaderBytes(DType dtype, const Shape& shape,
                                           size_t min_bytes = 0);

// Writes `tensor` (float32, int32 or int64) as a version 1.0 .npy file.
absl::Status WriteNpy(const std::string& path, const Tensor& tensor);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_NPY_H_
