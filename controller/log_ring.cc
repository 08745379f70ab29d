#include "controller/log_ring.h"

#include <utility>

namespace trainyard {

std::string CutUtf8(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t n = max_bytes;
  // Back up over continuation bytes (10xxxxxx) to the start of the
  // character that would be cut, and leave that character out.
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return text.substr(0, n);
}

LogRing::LogRing(LogRingLimits limits) : limits_(limits) {}

int64_t LogRing::Append(v1::LogLine line) {
  int64_t seq;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return -1;
    if (line.text().size() > limits_.max_line_bytes) {
      line.set_text(CutUtf8(line.text(), limits_.max_line_bytes));
    }
    seq = first_seq_ + static_cast<int64_t>(lines_.size());
    line.set_seq(seq);
    bytes_ += line.text().size();
    lines_.push_back(std::move(line));
    while (!lines_.empty() &&
           (lines_.size() > limits_.max_lines || bytes_ > limits_.max_bytes)) {
      bytes_ -= lines_.front().text().size();
      lines_.pop_front();
      ++first_seq_;
    }
  }
  Notify();
  return seq;
}

void LogRing::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
  }
  Notify();
}

void LogRing::Notify() {
  std::vector<std::shared_ptr<Listener>> live;
  {
    absl::MutexLock lock(&mu_);
    live = listeners_.Live();
  }
  for (auto& l : live) l->OnLogLines();
}

LogRing::Snapshot LogRing::Subscribe(std::weak_ptr<Listener> listener) {
  absl::MutexLock lock(&mu_);
  listeners_.Add(std::move(listener));
  return {first_seq_ + static_cast<int64_t>(lines_.size()), closed_};
}

LogRing::Snapshot LogRing::state() const {
  absl::MutexLock lock(&mu_);
  return {first_seq_ + static_cast<int64_t>(lines_.size()), closed_};
}

bool LogRing::Read(int64_t* seq, v1::LogLine* out) const {
  absl::MutexLock lock(&mu_);
  if (*seq < first_seq_) *seq = first_seq_;
  const int64_t index = *seq - first_seq_;
  if (index >= static_cast<int64_t>(lines_.size())) return false;
  *out = lines_[index];
  return true;
}

size_t LogRing::lines() const {
  absl::MutexLock lock(&mu_);
  return lines_.size();
}

size_t LogRing::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace trainyard
