// BatchReader: the first stage's read-ahead over a sharded source. A thread
// of its own reads the rows of the next training batches (the order of a
// BatchSampler with the job's batch size, shuffle and seed) out of the
// memory-mapped shards while the current step computes, into a few
// buffers allocated once (pinned host memory for a device stage, which the
// device's copy engines read directly). The step then takes a batch that
// is already in memory: it waits only when the disk is behind.
//
// The reader never decides what a step reads. Take(position) names the
// sampler position the stage is at; a read-ahead batch is used only when it
// was read for exactly that position, and any other position (a resumed or
// restored job) restarts the reader there. So the rows a step sees are the
// sampler's, with or without read-ahead, and a read error (a shard that
// changed since the job opened it) is returned by the Take of the batch
// that needed those rows, not earlier.
//
// Memory: depth + 1 buffers of one batch each (this replica's part of it),
// plus the pages one read maps (NpyShards drops them after each read).
//
// Ownership: holds a reference to the source (NpyShards) and owns its
// buffers and its thread, which the destructor stops and joins.
// Thread safety: Take is called from one thread (the stage's).
#ifndef TRAINYARD_ENGINE_BATCH_READER_H_
#define TRAINYARD_ENGINE_BATCH_READER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/npy_shards.h"
#include "core/tensor.h"

namespace trainyard {

class BatchReader {
 public:
  struct Options {
    int64_t batch_size = 1;  // rows a sampler batch takes (>= 1)
    bool shuffle = false;
    uint64_t seed = 0;
    // This replica's part of every batch: rows [slice_begin, slice_end) of
    // the batch's row list (0 <= begin < end <= batch_size).
    int64_t slice_begin = 0;
    int64_t slice_end = 1;
    // Batches read ahead of the one in use (>= 1).
    int depth = 2;
    // Features as the files store them (float16 / bfloat16 words copied
    // as they are, for widening on the device); else float32.
    bool stored_width = false;
    // Allocates one buffer (host memory; pinned for a device stage).
    std::function<absl::StatusOr<Tensor>(DType, Shape)> allocate;
  };

  // A batch's part for this replica: features [n, D] (float32, or the
  // files' dtype with stored_width) and targets [n] or [n, K].
  struct Batch {
    Tensor features;
    Tensor targets;
  };

  // Allocates the buffers; reads nothing until the first Take. Errors:
  // InvalidArgument for options out of range; the allocator's errors.
  static absl::StatusOr<std::unique_ptr<BatchReader>> Create(
      std::shared_ptr<const NpyShards> source, Options options);

  ~BatchReader();
  BatchReader(const BatchReader&) = delete;
  BatchReader& operator=(const BatchReader&) = delete;

  // The batch the sampler yields at `position` (rows consumed so far),
  // waiting for it to be read; the reader then goes on reading the batches
  // after it. The tensors stay valid and unchanged until the next Take (on
  // a device, the copies queued from them must be complete by then). A read
  // error is returned here, for the batch that needed the rows.
  absl::StatusOr<Batch> Take(int64_t position);

 private:
  struct Slot {
    Batch batch;
    int64_t position = -1;
    absl::Status status;
  };

  BatchReader(std::shared_ptr<const NpyShards> source, Options options)
      : source_(std::move(source)), options_(std::move(options)) {}
  void Loop();
  // The rows the sampler gives at `position`, this replica's part.
  std::vector<int64_t> SliceRows(int64_t position) const;

  const std::shared_ptr<const NpyShards> source_;
  const Options options_;
  std::vector<Slot> slots_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> free_;        // slots to read into
  std::deque<int> ready_;       // read, in position order
  int held_ = -1;               // the slot the last Take returned
  int64_t next_position_ = -1;  // the next batch to read; -1: idle
  uint64_t generation_ = 0;     // bumped by a restart
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_BATCH_READER_H_
