// ShardWriter: writes a stream of (features, targets) rows into a new folder
// as pairs of .npy shards plus shards.json (layout: docs/DATA.md):
//
//   <dir>/x-00000.npy  features [S, D]            rows [0, S)
//   <dir>/y-00000.npy  targets int64 [S] or float32 [S, K], the same rows
//   <dir>/x-00001.npy ...                         rows [S, 2S) ...
//   <dir>/shards.json  every pair's rows, bytes and sha256, written last
//
// Features arrive as float32 and are stored as the layout says: float32,
// float16 ('<f2') or bfloat16 (as '<u2' words, numpy having no bfloat16),
// each rounded to nearest even (core/npy.h FloatToFloat16, core/bfloat16.h
// FloatToBf16, as numpy's astype(np.float16) and torch's
// .to(torch.bfloat16) round); a finite value past the type's range becomes
// infinity, as there, and is counted (ShardPair::overflowed).
//
// Rows are streamed to the open shard's temp files (".x-00000.npy.tmp"), so
// memory stays a few stdio buffers whatever the shard size; a full shard's
// header is written last, the files fsynced and renamed into place, so a
// shard file exists only complete. Unless Finish succeeds, the destructor
// removes every file the writer made (and the folder, if it made it), so a
// failed conversion leaves nothing behind.
//
// Ownership: the writer owns its open temp files. Thread safety: none (one
// thread at a time).
#ifndef TRAINYARD_CLI_SHARD_WRITER_H_
#define TRAINYARD_CLI_SHARD_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace trainyard {

// The shape of every shard pair.
struct ShardLayout {
  int64_t shard_rows = 0;  // S >= 1 (the last shard may be shorter)
  int64_t features = 0;    // D >= 1: features [n, D]
  // How features are stored: kFloat32, kFloat16 or kBFloat16.
  DType features_dtype = DType::kFloat32;
  // kInt64: class ids, targets int64 [n]; kFloat32: targets float32 [n, K].
  DType target_dtype = DType::kInt64;
  int64_t target_width = 0;  // K >= 1 for kFloat32; 0 for kInt64
};

// One written pair, as listed in shards.json.
struct ShardPair {
  std::string features_file;  // base name, "x-00000.npy"
  std::string targets_file;   // "y-00000.npy"
  int64_t rows = 0;
  int64_t features_bytes = 0;  // whole file sizes
  int64_t targets_bytes = 0;
  std::string features_sha256;  // of the whole file, lowercase hex
  std::string targets_sha256;
  // Finite feature values stored as infinity (past a half-width type's
  // range); not in shards.json.
  int64_t overflowed = 0;
};

// The base name of shard `index`'s features ('x') or targets ('y') file:
// at least five digits ("x-00000.npy", ..., "x-123456.npy").
std::string ShardFileName(char kind, int64_t index);

class ShardWriter {
 public:
  // Called with the rows written so far after each Append (the caller rate
  // limits its progress output).
  using ProgressFn = std::function<void(int64_t rows)>;

  // Makes `dir` (parents too) or takes an existing empty folder.
  // Errors: InvalidArgument for a bad layout; FailedPrecondition naming
  // `dir` when it exists and is not an empty folder; I/O errors name the
  // path.
  static absl::StatusOr<std::unique_ptr<ShardWriter>> Create(
      const std::string& dir, const ShardLayout& layout,
      ProgressFn progress = nullptr);

  // Removes what was written unless Finish succeeded.
  ~ShardWriter();

  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends `n` rows: `features` float32 [n, D] (stored as the layout
  // says), `targets` [n] int64 or [n, K] float32 as the layout says (native
  // byte order, i.e. little-endian). Completes each shard as it fills.
  // Errors name the file that could not be written; after one, only the
  // destructor may be called.
  absl::Status Append(const float* features, const void* targets, int64_t n);

  // Rows appended so far.
  int64_t rows() const { return rows_; }

  // Completes the last (shorter) shard and writes shards.json; returns the
  // pairs in order. Errors name the file.
  absl::StatusOr<std::vector<ShardPair>> Finish();

 private:
  ShardWriter(std::string dir, ShardLayout layout, bool made_dir,
              ProgressFn progress);

  absl::Status OpenShard();
  // Writes `n` rows of float32 `features` to the open shard, as stored.
  absl::Status WriteFeatures(const float* features, int64_t n);
  absl::Status CloseShard();
  absl::Status WriteShardsJson();
  void RemoveWritten();

  const std::string dir_;
  const ShardLayout layout_;
  const bool made_dir_;
  const ProgressFn progress_;
  int64_t rows_ = 0;
  int64_t shard_fill_ = 0;       // rows in the open shard
  std::FILE* x_file_ = nullptr;  // the open shard's temp files
  std::FILE* y_file_ = nullptr;
  std::vector<std::string> written_;  // final and temp paths made so far
  std::vector<ShardPair> pairs_;
  std::vector<uint16_t> narrowed_;  // half-width rows being written
  int64_t overflowed_ = 0;          // in the open shard
  bool finished_ = false;
};

}  // namespace trainyard

#endif  // TRAINYARD_CLI_SHARD_WRITER_H_
