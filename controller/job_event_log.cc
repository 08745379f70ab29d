#include "controller/job_event_log.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainyard {

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED ||
         state == v1::CANCELLED;
}

JobEventLog::JobEventLog(int64_t first, std::vector<v1::JobEvent> tail,
                         v1::JobStateChange state, int64_t max_in_memory,
                         StoredEvents stored)
    : max_in_memory_(std::max<int64_t>(max_in_memory, 1)),
      stored_(std::move(stored)),
      first_(first),
      state_(std::move(state)) {
  const size_t skip = tail.size() > static_cast<size_t>(max_in_memory_)
                          ? tail.size() - static_cast<size_t>(max_in_memory_)
                          : 0;
  first_ += static_cast<int64_t>(skip);
  for (size_t i = skip; i < tail.size(); ++i) {
    events_.push_back(std::make_shared<const v1::JobEvent>(std::move(tail[i])));
  }
}

int64_t JobEventLog::Append(v1::JobEvent event) {
  auto shared = std::make_shared<const v1::JobEvent>(std::move(event));
  int64_t seq;
  {
    absl::MutexLock lock(&mu_);
    if (shared->has_state()) state_ = shared->state();
    seq = first_ + static_cast<int64_t>(events_.size());
    events_.push_back(std::move(shared));
    if (static_cast<int64_t>(events_.size()) > max_in_memory_) {
      events_.pop_front();
      ++first_;
    }
  }
  Notify();
  return seq;
}

void JobEventLog::Notify() {
  std::vector<std::shared_ptr<Listener>> live;
  {
    absl::MutexLock lock(&mu_);
    live = listeners_.Live();
  }
  for (auto& l : live) l->OnJobEvents();
}

int64_t JobEventLog::size() const {
  absl::MutexLock lock(&mu_);
  return first_ + static_cast<int64_t>(events_.size());
}

int64_t JobEventLog::first_in_memory() const {
  absl::MutexLock lock(&mu_);
  return first_;
}

JobEventLog::Snapshot JobEventLog::Subscribe(std::weak_ptr<Listener> listener) {
  absl::MutexLock lock(&mu_);
  listeners_.Add(std::move(listener));
  Snapshot snap;
  snap.state = state_;
  snap.size = first_ + static_cast<int64_t>(events_.size());
  return snap;
}

absl::Status JobEventLog::Read(int64_t from, int64_t max,
                               std::vector<v1::JobEvent>* out) const {
  if (from < 0 || max <= 0) return absl::OkStatus();
  int64_t older = 0;  // how many to read from the store
  std::vector<std::shared_ptr<const v1::JobEvent>> held;
  {
    absl::MutexLock lock(&mu_);
    older = std::min(max, first_ - from);
    const int64_t end = first_ + static_cast<int64_t>(events_.size());
    for (int64_t i = std::max(from, first_); i < end && i < from + max; ++i) {
      held.push_back(events_[i - first_]);
    }
  }
  if (older > 0) {
    absl::StatusOr<std::vector<v1::JobEvent>> events = stored_(from, older);
    if (!events.ok()) {
      return absl::Status(
          events.status().code(),
          absl::StrCat("reading events ", from, "..", from + older - 1,
                       " from the store: ", events.status().message()));
    }
    for (v1::JobEvent& e : *events) out->push_back(std::move(e));
  }
  // They follow: `held` starts at the first event in memory when `older`
  // was counted.
  for (const auto& e : held) out->push_back(*e);
  return absl::OkStatus();
}

}  // namespace trainyard
