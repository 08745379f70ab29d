// Reader and writer for the .npy files numpy writes (format versions 1.0,
// 2.0 and 3.0): little-endian float32, int32 or int64, C order.
//
// Every error names the file and what is wrong with it, e.g.
//   data/x.npy: dtype '<f8' is not supported (expected <f4, <i4 or <i8)
//   data/x.npy: truncated: header promises 4096 bytes of data, file has 100
#ifndef TRAINYARD_CORE_NPY_H_
#define TRAINYARD_CORE_NPY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace trainyard {

struct NpyHeader {
  DType dtype = DType::kFloat32;
  Shape shape;
  size_t data_offset = 0;  // bytes from the start of the file
};

// Parses only the header (cheap; used by spec validation). Checks the magic,
// version, dtype, fortran_order == False and that the file is long enough.
absl::StatusOr<NpyHeader> ReadNpyHeader(const std::string& path);

// Reads the whole array.
absl::StatusOr<Tensor> ReadNpy(const std::string& path);

// Writes `tensor` (float32, int32 or int64) as a version 1.0 .npy file.
absl::Status WriteNpy(const std::string& path, const Tensor& tensor);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_NPY_H_
