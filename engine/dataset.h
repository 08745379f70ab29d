// Training data in memory: loading a DataSource (npy files or a seeded
// synthetic generator, proto/job_spec.proto), the held-out tail split, and
// the BatchSampler that decides which rows each step sees.
//
// Everything random here is drawn from core/random.h with the streams named
// below, so a given seed produces bitwise the same data and batch order on
// every machine (and a Python reference can reproduce them).
//
// Thread safety: Dataset is a plain value (its Tensors share storage when
// copied, see core/tensor.h; treat them as read-only). A BatchSampler is not
// thread-safe; use one per thread.
#ifndef TRAINYARD_ENGINE_DATASET_H_
#define TRAINYARD_ENGINE_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/npy_shards.h"
#include "core/tensor.h"
#include "proto/job_spec.pb.h"

namespace trainyard {

// A data set: its rows in memory (features and targets), or, for a sharded
// source (npy_shards), in memory-mapped files read a batch at a time
// (`shards`; features and targets are then undefined).
struct Dataset {
  Tensor features;  // [N, D] float32
  // [N] int32 or int64 (class ids), or [N, K] float32 (regression targets).
  Tensor targets;
  // Human-readable origin, e.g. the npy paths with shapes, for logs.
  std::string description;
  std::shared_ptr<const NpyShards> shards;

  bool in_memory() const { return shards == nullptr; }
  int64_t num_rows() const {
    return shards != nullptr ? shards->num_rows() : features.dim(0);
  }
  int64_t num_features() const {
    return shards != nullptr ? shards->num_features() : features.dim(1);
  }
};

// Rng streams (core/random.h `Rng(seed, stream)`) used below. Distinct from
// small stream numbers so data never reuses the draws of parameter init.
inline constexpr uint64_t kSyntheticFeatureStream = 0x4441544100000000ull;
inline constexpr uint64_t kSyntheticTeacherStream = kSyntheticFeatureStream + 1;
inline constexpr uint64_t kSyntheticNoiseStream = kSyntheticFeatureStream + 2;
inline constexpr uint64_t kShuffleStreamBase = 0x5348554600000000ull;
// Added to the feature and noise streams of an eval source, so that with the
// same seed it shares the train source's teacher / class centers (the same
// task) but draws different rows (no copy of the train set).
inline constexpr uint64_t kSyntheticEvalStreamOffset = 0x10;

// Which set a source feeds; only synthetic sources care.
enum class DataSplit { kTrain, kEval };
inline constexpr int64_t kTeacherHiddenWidth = 32;

// Loads `source`. `seed` of a synthetic source of 0 means `default_seed`.
//
// npy: features must be float32 [N, D] (N, D >= 1); targets int32/int64 [N]
// or float32 [N, K]; relative paths resolve against `base_dir`. Errors name
// the file(s) and what is wrong (missing, bad dtype/shape, row counts
// differ).
//
// synthetic (all sums in double, rounded to float32 at the end):
//   "teacher_regression": x[i, :] ~ N(0, 1) drawn row-major from
//     Rng(seed, kSyntheticFeatureStream); a teacher from
//     Rng(seed, kSyntheticTeacherStream), drawn in this order:
//     W1 [32, D] ~ N(0, 1)/sqrt(D), b1 [32] ~ 0.5 N(0, 1),
//     W2 [K, 32] ~ N(0, 1)/sqrt(32);
//     y[i, :] = W2 tanh(W1 x[i, :] + b1) + noise * N(0, 1), the noise drawn
//     row-major from Rng(seed, kSyntheticNoiseStream). Targets float32 [N, K].
//   "gaussian_blobs": centers [K, D] ~ 3 N(0, 1) from
//     Rng(seed, kSyntheticTeacherStream); then for each row i in order, from
//     Rng(seed, kSyntheticFeatureStream): label = Below(K), then
//     x[i, j] = centers[label, j] + noise * N(0, 1) for j = 0..D-1.
//     Targets int64 [N].
//   (N, D, K = num_samples, num_features, num_outputs; all must be >= 1 and
//   noise >= 0.)
//   With split kEval the feature and noise streams are shifted by
//   kSyntheticEvalStreamOffset; the teacher / centers stream is not.
absl::StatusOr<Dataset> LoadDataSource(const trainyard::v1::DataSource& source,
                                       const std::string& base_dir,
                                       uint64_t default_seed,
                                       DataSplit split = DataSplit::kTrain);

// Splits off the last floor(N * fraction) rows as the eval set (first:
// train, second: eval). The halves share storage with `data`.
// InvalidArgument unless 0 < fraction < 1 and both halves get >= 1 row.
absl::StatusOr<std::pair<Dataset, Dataset>> SplitTail(const Dataset& data,
                                                      double fraction);

// Copies `rows` (each in [0, N); CHECK-fails otherwise for data in memory,
// a bug) of `data` into new tensors: features [B, D] float32, targets [B] or
// [B, K]. A sharded source reads them from its files: errors name the file
// (one that changed since the job opened it is DataLoss).
absl::StatusOr<Dataset> Gather(const Dataset& data,
                               const std::vector<int64_t>& rows);

// The row at place `index` (0 <= index < n, n >= 1) of epoch `epoch`'s
// order of a shuffled source: a keyed bijection of [0, n), computed on its
// own (no n-sized table), so any step's rows are known directly. With
// Mix64 the SplitMix64 finalizer (z += 0x9E3779B97F4A7C15;
// z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9; z = (z ^ z >> 27) *
// 0x94D049BB133111EB; z ^ z >> 31, all mod 2^64):
//   h = the smallest h >= 1 with 4^h >= n; mask = 2^h - 1;
//   base = Mix64(seed ^ Mix64(kShuffleStreamBase + epoch));
//   key[r] = Mix64(base + r) for r = 0..3;
//   F(x): L = x >> h, R = x & mask; 4 rounds of
//         (L, R) = (R, L ^ (Mix64(R ^ key[r]) & mask)); then (L << h) | R;
//   the row is F(index), F(F(index)), ... the first value below n (cycle
//   walking: F permutes [0, 4^h), so this permutes [0, n)).
// tools/shuffle_reference.py is the same in Python.
int64_t ShuffledRow(int64_t index, int64_t n, uint64_t seed, uint64_t epoch);

// The sequence of batches over N rows. Conceptually an endless stream of
// row indices, consumed B at a time:
//   shuffle off: 0, 1, ..., N-1, 0, 1, ... (file order, wrapping), so batch
//     k is rows k*B ... k*B+B-1 modulo N;
//   shuffle on: epoch e = position / N visits every row once, place
//     i = position % N holding ShuffledRow(i, N, seed, e). A batch may span
//     an epoch boundary.
// position() = rows consumed so far; Seek(p) resumes exactly there (in
// O(1): nothing is replayed), so a restored sampler yields bitwise the same
// batches as an uninterrupted one.
class BatchSampler {
 public:
  // num_rows >= 1, batch_size >= 1 (CHECK: the spec validator ensures it).
  BatchSampler(int64_t num_rows, int64_t batch_size, bool shuffle,
               uint64_t seed);

  // The next batch's row indices (batch_size of them); advances position().
  std::vector<int64_t> Next();

  int64_t position() const { return position_; }
  // Jumps to `position` (>= 0; CHECK) rows consumed.
  void Seek(int64_t position);

  int64_t epoch() const { return position_ / num_rows_; }

 private:
  int64_t RowAt(int64_t position) const;  // row index at a stream position

  int64_t num_rows_;
  int64_t batch_size_;
  bool shuffle_;
  uint64_t seed_;
  int64_t position_ = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_DATASET_H_
