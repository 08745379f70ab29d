#include "engine/batch_reader.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/dataset.h"
#include "glog/logging.h"

namespace trainyard {
namespace {

Shape TargetShape(const NpyShards& source, int64_t rows) {
  const int64_t k = source.target_width();
  return k > 0 ? Shape{rows, k} : Shape{rows};
}

}  // namespace

absl::StatusOr<std::unique_ptr<BatchReader>> BatchReader::Create(
    std::shared_ptr<const NpyShards> source, Options options) {
  if (source == nullptr || options.batch_size < 1 || options.depth < 1 ||
      options.slice_begin < 0 || options.slice_end <= options.slice_begin ||
      options.slice_end > options.batch_size || !options.allocate) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch reader: bad options (batch ", options.batch_size,
                     ", rows [", options.slice_begin, ", ", options.slice_end,
                     "), depth ", options.depth, ")"));
  }
  const int64_t rows = options.slice_end - options.slice_begin;
  const DType feature_dtype =
      options.stored_width ? source->feature_dtype() : DType::kFloat32;
  const Shape features = {rows, source->num_features()};
  const Shape targets = TargetShape(*source, rows);
  std::unique_ptr<BatchReader> reader(
      new BatchReader(std::move(source), std::move(options)));
  const Options& o = reader->options_;
  reader->slots_.resize(o.depth + 1);
  for (size_t i = 0; i < reader->slots_.size(); ++i) {
    Slot& slot = reader->slots_[i];
    ASSIGN_OR_RETURN(slot.batch.features, o.allocate(feature_dtype, features));
    ASSIGN_OR_RETURN(slot.batch.targets,
                     o.allocate(reader->source_->target_dtype(), targets));
    reader->free_.push_back(static_cast<int>(i));
  }
  reader->thread_ = std::thread([p = reader.get()] { p->Loop(); });
  return reader;
}

BatchReader::~BatchReader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<int64_t> BatchReader::SliceRows(int64_t position) const {
  BatchSampler sampler(source_->num_rows(), options_.batch_size,
                       options_.shuffle, options_.seed);
  sampler.Seek(position);
  std::vector<int64_t> rows = sampler.Next();
  return std::vector<int64_t>(rows.begin() + options_.slice_begin,
                              rows.begin() + options_.slice_end);
}

void BatchReader::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] {
      return stop_ || (next_position_ >= 0 && !free_.empty());
    });
    if (stop_) return;
    const int s = free_.front();
    free_.pop_front();
    const int64_t position = next_position_;
    const uint64_t generation = generation_;
    lock.unlock();
    // Only this thread touches a slot between taking it from free_ and
    // handing it to ready_.
    Slot& slot = slots_[s];
    slot.position = position;
    slot.status = source_->GatherInto(SliceRows(position), &slot.batch.features,
                                      &slot.batch.targets);
    lock.lock();
    if (generation != generation_) {  // restarted meanwhile: not wanted
      free_.push_back(s);
      continue;
    }
    ready_.push_back(s);
    // After an error, nothing further is read: the Take of this batch
    // fails, and a restart (another position) reads again.
    next_position_ = slot.status.ok() ? position + options_.batch_size : -1;
    cv_.notify_all();
  }
}

absl::StatusOr<BatchReader::Batch> BatchReader::Take(int64_t position) {
  std::unique_lock<std::mutex> lock(mu_);
  if (held_ >= 0) {
    free_.push_back(held_);
    held_ = -1;
  }
  const bool on_its_way = !ready_.empty()
                              ? slots_[ready_.front()].position == position
                              : next_position_ == position;
  if (!on_its_way) {  // the first Take, or the stage moved (a restore)
    ++generation_;
    for (int s : ready_) free_.push_back(s);
    ready_.clear();
    next_position_ = position;
  }
  cv_.notify_all();
  cv_.wait(lock, [this] { return !ready_.empty(); });
  held_ = ready_.front();
  ready_.pop_front();
  const Slot& slot = slots_[held_];
  CHECK_EQ(slot.position, position) << "batch reader out of order";
  if (!slot.status.ok()) return slot.status;
  return slot.batch;
}

}  // namespace trainyard
