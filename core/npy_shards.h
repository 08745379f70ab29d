// NpyShards: a job's rows held in pairs of .npy shard files (features[i],
// targets[i]), memory-mapped read-only and never read whole, so a data set
// larger than memory can feed a stage with about one batch resident.
//
// The source's rows are pair 0's rows, then pair 1's, ... A Gather copies
// the rows asked for out of the mappings and then drops the pages it
// touched from this process (they stay in the page cache). Each file is
// checked before every Gather that reads it: a file changed since Open is a
// DataLoss naming it, never silently different data. (The check narrows,
// not closes, the window: a file truncated in place during a Gather's copy
// still faults the process with SIGBUS, as any mapped reader would.)
//
// Ownership: an NpyShards owns its open files and mappings (unmapped and
// closed when the last source sharing them, Slices included, goes away).
// Thread safety: immutable after Open; every method is const and may be
// called from any number of threads at once.
#ifndef TRAINYARD_CORE_NPY_SHARDS_H_
#define TRAINYARD_CORE_NPY_SHARDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace trainyard {

class NpyShards {
 public:
  // Opens pair i = (features[i], targets[i]) for every i. Paths are
  // absolute; the lists have the same, non-zero length. Checks, naming the
  // file and the reason, before returning:
  //  features: float32 or float16, 2-D [n_i, D], D >= 1 the same in every
  //    shard, n_i >= 1;
  //  targets: int32 or int64 [n_i], or float32 [n_i, K] with K >= 1 (the
  //    same dtype and K in every shard);
  //  a pair's row counts equal (the message names both files and counts);
  //  each file a regular file whose size matches its header (core/npy).
  // Records each file's (device, inode, size, mtime) and maps it read-only.
  // Keeps one descriptor and one mapping per file until the last view goes.
  // Errors: InvalidArgument (bad lists or file), NotFound (missing file),
  // PermissionDenied (unreadable file), ResourceExhausted (out of file
  // descriptors), Internal (mmap failure).
  static absl::StatusOr<std::shared_ptr<const NpyShards>> Open(
      const std::vector<std::string>& features,
      const std::vector<std::string>& targets);

  ~NpyShards();

  int64_t num_rows() const { return end_ - begin_; }  // of this view
  int64_t num_features() const;                       // D
  DType target_dtype() const;    // kInt32, kInt64 or kFloat32
  int64_t target_width() const;  // K for float32 targets, 0 for class ids
  // Pairs holding at least one of this view's rows.
  int num_shards() const;
  // Bytes this view's rows take in the files (features at their stored
  // width, plus targets; headers excluded): the whole data for an unsliced
  // source. For the planner's estimates.
  uint64_t bytes() const;

  // Rows `rows` of this view, in the given order (repeats allowed):
  // features float32 [B, D] (float16 widened exactly), targets [B] or
  // [B, K] in their dtype. Before copying from a file, checks it is
  // unchanged since Open (same inode, size and mtime, and its path still
  // names that inode); after copying, drops the pages it touched from this
  // process (madvise MADV_DONTNEED on the 2 MiB file-aligned windows around
  // them, which hold what the kernel mapped with them), so the resident set
  // stays about one batch; the pages stay in the page cache. Errors:
  // InvalidArgument naming a row outside [0, num_rows()); DataLoss "<path>:
  // changed since the job opened it (...)"; ResourceExhausted when the batch
  // cannot be allocated.
  absl::StatusOr<std::pair<Tensor, Tensor>> Gather(
      const std::vector<int64_t>& rows) const;

  // Rows [begin, end) of this view as a source of its own, sharing the
  // mappings (a held-out tail for evaluation). CHECK-fails unless
  // 0 <= begin <= end <= num_rows().
  std::shared_ptr<const NpyShards> Slice(int64_t begin, int64_t end) const;

 private:
  class MappedFile;
  struct Layout;

  NpyShards(std::shared_ptr<const Layout> layout, int64_t begin, int64_t end);

  // The pair holding source row `row` (of the whole source, not the view).
  int ShardOf(int64_t row) const;

  std::shared_ptr<const Layout> layout_;
  int64_t begin_;  // this view's rows [begin_, end_) of the whole source
  int64_t end_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CORE_NPY_SHARDS_H_
