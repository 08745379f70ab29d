#include "engine/checkpoint_writer.h"

#include <utility>

namespace trainyard {

CheckpointWriter::CheckpointWriter() : thread_([this] { Loop(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

int64_t CheckpointWriter::Submit(std::function<absl::Status()> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  return ++submitted_;
}

absl::Status CheckpointWriter::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

int64_t CheckpointWriter::completed() const {
  absl::MutexLock lock(&mu_);
  return completed_;
}

bool CheckpointWriter::Succeeded(int64_t seq) const {
  absl::MutexLock lock(&mu_);
  return completed_ >= seq && status_.ok();
}

absl::Status CheckpointWriter::WaitFor(int64_t seq) {
  absl::MutexLock lock(&mu_);
  auto done = [this, seq]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return completed_ >= seq;
  };
  mu_.Await(absl::Condition(&done));
  return status_;
}

absl::Status CheckpointWriter::Drain() {
  int64_t all;
  {
    absl::MutexLock lock(&mu_);
    all = submitted_;
  }
  return WaitFor(all);
}

void CheckpointWriter::Loop() {
  for (;;) {
    std::function<absl::Status()> task;
    bool skip = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CheckpointWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
            return w->stop_ || !w->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stop_ and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
      skip = !status_.ok();
    }
    absl::Status st = skip ? absl::OkStatus() : task();
    absl::MutexLock lock(&mu_);
    if (status_.ok() && !st.ok()) status_ = st;
    ++completed_;
  }
}

}  // namespace trainyard
