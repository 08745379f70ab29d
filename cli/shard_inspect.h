// Finding and checking .npy shard pairs (layout: docs/DATA.md) for
// `trainyard data inspect`: which pairs a folder or glob names, each file's
// dtype, shape, size and sha256, and that a pair's row counts agree (and,
// where the folder has a shards.json, that it lists the same rows and
// digests).
//
// Thread safety: the functions share no state.
#ifndef TRAINYARD_CLI_SHARD_INSPECT_H_
#define TRAINYARD_CLI_SHARD_INSPECT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/npy.h"
#include "core/tensor.h"

namespace trainyard {

struct ShardFileInfo {
  std::string path;
  DType dtype = DType::kFloat32;
  Shape shape;
  int64_t bytes = 0;   // the whole file
  std::string sha256;  // of the whole file, lowercase hex
};

struct ShardPairInfo {
  ShardFileInfo features;  // x-NNNNN.npy
  ShardFileInfo targets;   // y-NNNNN.npy
  int64_t rows = 0;
};

// The (features, targets) paths of the pairs `dir_or_glob` names, sorted by
// path: for a folder, its x-*.npy / y-*.npy files; otherwise the glob(3)
// pattern's matches named x-*.npy or y-*.npy (others are skipped), each
// paired with the other letter's file in the same folder.
// Errors: NotFound when nothing matches; InvalidArgument naming a file
// whose partner is missing.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> FindShardPairs(
    const std::string& dir_or_glob);

// Checks that features file `features` holds float32, float16 or bfloat16
// [n, D >= 1] and targets file `targets` int64 [n] or float32 [n, K >= 1],
// with the same n. Errors: InvalidArgument naming the file at fault.
absl::Status CheckShardPairShapes(const std::string& features, DType x_dtype,
                                  const Shape& x_shape,
                                  const std::string& targets, DType y_dtype,
                                  const Shape& y_shape);

// Checks shard pairs one at a time, reading each folder's shards.json once.
// Thread safety: one thread at a time.
class ShardInspector {
 public:
  // `features_dtype`: what every features file must hold: kFloat32,
  // kFloat16, or kBFloat16 (2-byte words, '<u2' or '|V2', read as
  // bfloat16); unset: float32 or float16, as each header says (2-byte words
  // are then refused, naming the flag that reads them).
  explicit ShardInspector(std::optional<DType> features_dtype = std::nullopt)
      : features_dtype_(features_dtype) {}

  // Reads both headers (core/npy.h) and digests both files (streamed).
  // Errors: InvalidArgument naming the file for a bad header, features not
  // of the dtype asked for, shapes that CheckShardPairShapes refuses, or a
  // row count or sha256 that differs from the folder's shards.json (when
  // there is one and it lists the file; a shards.json that cannot be
  // parsed is an error naming it).
  absl::StatusOr<ShardPairInfo> Inspect(const std::string& features,
                                        const std::string& targets);

 private:
  struct Listed {
    int64_t rows = 0;
    std::string sha256;
  };
  using Listing = absl::flat_hash_map<std::string, Listed>;  // by base name

  // The folder's shards.json listing (empty when it has none).
  absl::StatusOr<const Listing*> ListingOf(const std::string& dir);
  // InvalidArgument naming `path` unless its header's dtype is the one
  // features_dtype_ asks for.
  absl::Status CheckFeaturesDType(const std::string& path,
                                  const NpyHeader& header) const;
  // `features`: the file is a features file (its dtype checked against
  // features_dtype_), not a targets file.
  absl::StatusOr<ShardFileInfo> InspectFile(const std::string& path,
                                            bool features);

  const std::optional<DType> features_dtype_;
  absl::flat_hash_map<std::string, Listing> listings_;  // by folder
};

}  // namespace trainyard

#endif  // TRAINYARD_CLI_SHARD_INSPECT_H_
