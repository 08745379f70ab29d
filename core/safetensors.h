// Reader and writer for safetensors files (https://huggingface.co/docs/
// safetensors): an 8-byte little-endian header length, a JSON header mapping
// each tensor name to {dtype, shape, data_offsets} plus an optional
// "__metadata__" string->string map, then the raw little-endian data.
//
// Supported dtypes: F32, BF16, I32, I64, U8. Tensors are written in the
// order given, packed back to back (8-byte alignment within the data section
// is not required by the format and not done); the JSON header is padded
// with spaces to a multiple of 8 bytes, as the Python package does.
//
// Thread safety: free functions with no shared state; a SafetensorsFile is a
// plain value (its Tensors share storage when copied, see core/tensor.h).
#ifndef TRAINYARD_CORE_SAFETENSORS_H_
#define TRAINYARD_CORE_SAFETENSORS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace trainyard {

struct SafetensorsFile {
  // In file order (by data offset).
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;

  // The tensor called `name`, or NotFound naming it.
  absl::StatusOr<Tensor> Get(const std::string& name) const;
};

// Reads and validates a whole file: header JSON well-formed, dtypes known,
// offsets contiguous, in range and matching shape*dtype size. Errors name the
// file and, where there is one, the tensor.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

// The same checks on bytes already in memory; `source` names them in errors
// (usually the path they came from).
absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes,
                                                 const std::string& source);

// OK if `file` can be written: names non-empty, unique and not
// "__metadata__", every tensor on the CPU. Errors name the tensor.
absl::Status ValidateSafetensors(const SafetensorsFile& file);

// Serialises to bytes (what WriteSafetensors puts in the file). `file` must
// pass ValidateSafetensors (CHECK-fails otherwise: a bug in the caller).
std::string SerializeSafetensors(const SafetensorsFile& file);
// The same bytes in a host uint8 tensor (its storage from the host
// allocator, whose cache makes repeated snapshots cheap).
absl::StatusOr<Tensor> SerializeSafetensorsToTensor(
    const SafetensorsFile& file);

// Writes atomically: a temp file in the same folder, fsync, rename, fsync of
// the folder. An existing file at `path` stays intact on any failure.
// Returns ValidateSafetensors' error (with the path) for an invalid `file`.
absl::Status WriteSafetensors(const std::string& path,
                              const SafetensorsFile& file);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_SAFETENSORS_H_
