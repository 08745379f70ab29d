// NpyShards: a job's rows held in pairs of .npy shard files (features[i],
// targets[i]), memory-mapped read-only and never read whole, so a data set
// larger than memory can feed a stage with about one batch resident.
//
// The source's rows are pair 0's rows, then pair 1's, ... The mappings are
// advised random (no read-around on a fault: a shuffled row costs its own
// pages, not the disk's read-ahead window); a gather asks the kernel for
// every page the batch needs at once (so a cold read is many requests in
// flight, not one page fault at a time), copies the rows asked
// for out of the mappings and then drops the pages it touched from this
// process (they stay in the page cache). Each file is checked before every
// gather that reads it: a file changed since Open is a DataLoss naming it,
// never silently different data. (The check narrows, not closes, the
// window: a file truncated in place during a gather's copy still faults the
// process with SIGBUS, as any mapped reader would.)
//
// Ownership: an NpyShards owns its mappings (unmapped when the last source
// sharing them, Slices included, goes away). It holds no file descriptor:
// each file's is closed as soon as the file is mapped, so a source of
// thousands of pairs stays within RLIMIT_NOFILE. Its limit is the process's
// number of mappings instead, vm.max_map_count (65530 by default): one per
// file, so some 30,000 pairs next to what else the process maps.
// Thread safety: immutable after Open; every method is const and may be
// called from any number of threads at once.
#ifndef TRAINYARD_CORE_NPY_SHARDS_H_
#define TRAINYARD_CORE_NPY_SHARDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace trainyard {

struct NpyShardsOptions {
  // The features files hold bfloat16 values as 2-byte words: dtype '<u2',
  // or '|V2' / '<V2' as numpy saves an ml_dtypes.bfloat16 array (the spec's
  // NpyShardsSource.features_dtype "bfloat16"). Without it, such files are
  // refused.
  bool bfloat16_features = false;
};

class NpyShards {
 public:
  // Opens pair i = (features[i], targets[i]) for every i. Paths are
  // absolute; the lists have the same, non-zero length. Checks, naming the
  // file and the reason, before returning:
  //  features: 2-D [n_i, D], D >= 1 the same in every shard, n_i >= 1;
  //    float32 or float16 ('<f4', '<f2'; the two may be mixed), or with
  //    options.bfloat16_features bfloat16 words in every file, e.g.
  //    "x-00003.npy: dtype '<f4', but features_dtype is bfloat16 (expected
  //    '<u2' or '|V2')";
  //  targets: int32 or int64 [n_i], or float32 [n_i, K] with K >= 1 (the
  //    same dtype and K in every shard);
  //  a pair's row counts equal (the message names both files and counts);
  //  each file a regular file whose size matches its header (core/npy).
  // Records each file's (device, inode, size, mtime), maps it read-only and
  // closes its descriptor.
  // Errors: InvalidArgument (bad lists or file), NotFound (missing file),
  // PermissionDenied (unreadable file), ResourceExhausted (out of file
  // descriptors, or of mappings: vm.max_map_count), Internal (another mmap
  // failure).
  static absl::StatusOr<std::shared_ptr<const NpyShards>> Open(
      const std::vector<std::string>& features,
      const std::vector<std::string>& targets,
      const NpyShardsOptions& options = {});

  ~NpyShards();

  int64_t num_rows() const { return end_ - begin_; }  // of this view
  int64_t num_features() const;                       // D
  // The features' stored type: kBFloat16 (options.bfloat16_features),
  // kFloat16 (every file float16) or kFloat32 (every file float32, or
  // float32 and float16 files mixed: the type they all widen to exactly).
  DType feature_dtype() const;
  DType target_dtype() const;    // kInt32, kInt64 or kFloat32
  int64_t target_width() const;  // K for float32 targets, 0 for class ids
  // Pairs holding at least one of this view's rows.
  int num_shards() const;
  // Bytes this view's rows take in the files (features at their stored
  // width, plus targets; headers excluded): the whole data for an unsliced
  // source. For the planner's estimates.
  uint64_t bytes() const;

  // Writes rows `rows` of this view, in the given order (repeats allowed),
  // into tensors the caller allocated in host memory (pinned or not):
  //  `features` [B, D], B = rows.size(), of dtype kFloat32 (the stored
  //    values widened exactly) or feature_dtype() (the stored bits copied
  //    as they are);
  //  `targets` [B] (class ids) or [B, K] of target_dtype().
  // Before copying from a file, checks it is unchanged since Open (its path
  // still names the same device and inode, of the same size and mtime) and
  // asks the kernel to read every page the batch needs (madvise
  // MADV_WILLNEED over each row's page-aligned range); after copying, drops
  // the pages it touched from this process (madvise MADV_DONTNEED on the
  // 2 MiB file-aligned windows around them, which hold what the kernel
  // mapped with them), so the resident set stays about one batch; the pages
  // stay in the page cache. Allocates nothing but index vectors of B
  // entries. On an error the tensors' contents are unspecified.
  // Errors: InvalidArgument naming a row outside [0, num_rows()), or a
  // tensor not on the host or of another dtype or shape (naming what it is
  // and what the batch needs); DataLoss "<path>: changed since the job
  // opened it (...)".
  absl::Status GatherInto(const std::vector<int64_t>& rows, Tensor* features,
                          Tensor* targets) const;

  // GatherInto fresh host tensors: features float32 [B, D], targets as
  // there. Errors: GatherInto's, and ResourceExhausted when the batch
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
  // A batch's rows in source order: (source row, batch position).
  using SourceRow = std::pair<int64_t, int64_t>;
  // Entries [begin, end) of a sorted batch that lie in shard `shard`.
  struct ShardRun {
    int shard;
    size_t begin, end;
  };

  NpyShards(std::shared_ptr<const Layout> layout, int64_t begin, int64_t end);

  // The pair holding source row `row` (of the whole source, not the view).
  int ShardOf(int64_t row) const;
  // InvalidArgument unless `features` and `targets` can hold a batch of
  // `batch` rows (see GatherInto).
  absl::Status CheckBatchTensors(int64_t batch, const Tensor& features,
                                 const Tensor& targets) const;
  // `rows` as sorted source rows, split into runs by shard; InvalidArgument
  // naming a row out of range.
  absl::Status SortByShard(const std::vector<int64_t>& rows,
                           std::vector<SourceRow>* sorted,
                           std::vector<ShardRun>* runs) const;

  std::shared_ptr<const Layout> layout_;
  int64_t begin_;  // this view's rows [begin_, end_) of the whole source
  int64_t end_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CORE_NPY_SHARDS_H_
