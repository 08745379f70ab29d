// The output folder of an inference job (layout: docs/OUTPUT_FORMAT.md):
//
//   <dir>/manifest.json              complete: false at Open, true at Finish
//   <dir>/shard-00000/<name>.npy     rows [0, S) of output <name>
//   <dir>/shard-00001/<name>.npy     rows [S, 2S) ...
//
// Rows [0, N) are cut into shards of S rows (the last one shorter). Rows of
// a shard are buffered in memory, in any order, until all have arrived; then
// the shard is written into a temp folder, file by file (each fsynced), and
// that folder is renamed into place, so a shard folder exists only complete.
// Several processes of one job may share the folder, each writing its own
// shards; a job restarted after a crash keeps the complete shards (done())
// and writes the rest.
//
// Ownership: an OutputShards owns its buffered rows (copies of what Add is
// given); the folder is shared with the job's other processes.
// Thread safety: every method may be called from several threads at once.
// Rows are copied under one mutex; shards are written outside it, so
// threads completing different shards write concurrently.
#ifndef TRAINYARD_ENGINE_OUTPUT_SHARDS_H_
#define TRAINYARD_ENGINE_OUTPUT_SHARDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/tensor.h"

namespace trainyard {

// What identifies an inference job's output folder.
struct OutputJob {
  std::string dir;         // absolute
  int64_t rows = 0;        // N >= 0
  int64_t shard_rows = 0;  // S >= 1
  std::string job_digest;  // identity: a rerun of the same job has the same
                           // digest; not empty
  std::string model_json;  // JSON object text: recorded as "model"
                           // (checkpoint step, digest ...)
  std::string spec_json;   // JSON object text: recorded as "spec"
};

// Which of shards [0, num_shards) have a (complete) shard folder in `dir`
// now, whoever wrote them; all false when `dir` does not exist. Every stage
// of an inference job reads this at its start to skip the same shards.
// Errors: the folder cannot be listed (naming it).
absl::StatusOr<std::vector<bool>> CompleteShards(const std::string& dir,
                                                 int64_t num_shards);

class OutputShards {
 public:
  // Opens job.dir for writing:
  // - a missing folder is created (parents too), an empty one is used, and
  //   manifest.json (complete: false) is written;
  // - one whose manifest.json is trainyard-outputs-v1 with the same
  //   job_digest, rows and shard_rows is resumed: its shard folders count as
  //   done, and its manifest is left as it is.
  // Leftover temp entries (".shard-*.tmp-<pid>-*", ".manifest.json.tmp-*")
  // of processes no longer running on this host are then removed; those of
  // running processes are another process of this job at work and are kept.
  // Several processes may open the same folder at once: the first to create
  // manifest.json wins (an exclusive link), the others resume it.
  // Errors: InvalidArgument for a bad `job` (relative dir, rows < 0,
  // shard_rows < 1, empty digest, model_json or spec_json not a JSON
  // object); FailedPrecondition, with nothing in the folder touched, for a
  // folder that is anything else, e.g.
  //   inference.output_dir: /x/out exists and is not an earlier run of this
  //   job (it holds "a.txt")
  //   inference.output_dir: /x/out holds the outputs of another job (job
  //   digest 1a2b..., this job 9f8e...)
  // I/O errors name the path.
  static absl::StatusOr<std::unique_ptr<OutputShards>> Open(
      const OutputJob& job);

  OutputShards(const OutputShards&) = delete;
  OutputShards& operator=(const OutputShards&) = delete;

  // ceil(N / S).
  int64_t num_shards() const { return num_shards_; }
  // Rows [begin, end) of `shard` (0 <= shard < num_shards(); CHECK-fails
  // otherwise).
  std::pair<int64_t, int64_t> ShardRows(int64_t shard) const;
  // Whether `shard` was complete on disk when Open ran, or has been written
  // since by this object.
  bool done(int64_t shard) const;

  // Rows [row, row + n) of the outputs, n = dim 0 of every tensor: host
  // tensors of dtype float32, int32 or int64, with names that are file-name
  // safe ([A-Za-z0-9_.-], not starting with '.'), the same names in every
  // call, each keeping its dtype and trailing dims. Rows of a shard may
  // arrive in any order, each at most once, and must not cross a shard
  // boundary; rows of a shard that is done() are refused (skip such shards).
  // When a shard's rows are all in, its folder is written before Add
  // returns. n == 0 adds nothing.
  // Errors: InvalidArgument for rows out of range, crossing a shard, given
  // twice or in a done shard, no outputs, or outputs unlike earlier calls'
  // (naming the output and both dtypes and shapes); FailedPrecondition when
  // another process wrote the same shard meanwhile; I/O errors naming the
  // path (the shard is then lost to this object: Finish reports it missing).
  absl::Status Add(int64_t row, const NamedTensors& outputs);

  // Once every shard is written (by any process): checks that every shard
  // folder exists and that all hold the same .npy names, each with one
  // dtype and trailing dims and the shard's row count in dim 0, then
  // rewrites manifest.json with complete: true, "outputs" and "shards", and
  // removes leftover ".shard-*.tmp-*" folders (no shard is being written any
  // more). Idempotent. Errors: FailedPrecondition naming the first missing
  // shard, or the file that disagrees and how; I/O errors naming the path.
  absl::Status Finish();

 private:
  // A shard's rows received so far.
  struct Pending {
    std::vector<Tensor> tensors;  // per schema_ entry: [shard rows, ...]
    std::vector<bool> have;       // per row of the shard
    int64_t count = 0;            // rows received
  };
  // One output as the first Add gave it.
  struct Output {
    std::string name;
    DType dtype = DType::kFloat32;
    Shape trailing;  // dims after dim 0
  };

  OutputShards(OutputJob job, absl::flat_hash_set<int64_t> done);

  // Checks `outputs` against schema_ (setting it on the first call).
  absl::Status CheckOutputs(const NamedTensors& outputs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies rows [row, row + n) of shard `shard` into its buffer; returns
  // the buffer when the shard is now complete (taken out of pending_).
  absl::StatusOr<std::unique_ptr<Pending>> Buffer(int64_t shard, int64_t row,
                                                  int64_t n,
                                                  const NamedTensors& outputs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes shard `shard`'s folder from its complete buffer.
  absl::Status WriteShard(int64_t shard, const Pending& pending,
                          const std::vector<Output>& schema) const;

  const OutputJob job_;
  const int64_t num_shards_;

  mutable absl::Mutex mu_;
  std::vector<Output> schema_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, std::unique_ptr<Pending>> pending_
      ABSL_GUARDED_BY(mu_);
  // Shards whose rows are all in: being written, or their write failed.
  absl::flat_hash_set<int64_t> closed_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<int64_t> done_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_OUTPUT_SHARDS_H_
