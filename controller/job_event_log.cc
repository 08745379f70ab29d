#include "controller/job_event_log.h"

#include <utility>

namespace trainyard {

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED ||
         state == v1::CANCELLED;
}

JobEventLog::JobEventLog(std::vector<v1::JobEvent> history)
    : events_(std::move(history)) {
  for (const v1::JobEvent& e : events_) {
    if (e.has_state()) state_ = e.state();
  }
}

int64_t JobEventLog::Append(v1::JobEvent event) {
  int64_t seq;
  {
    absl::MutexLock lock(&mu_);
    if (event.has_state()) state_ = event.state();
    seq = static_cast<int64_t>(events_.size());
    events_.push_back(std::move(event));
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
  return static_cast<int64_t>(events_.size());
}

JobEventLog::Snapshot JobEventLog::Subscribe(std::weak_ptr<Listener> listener) {
  absl::MutexLock lock(&mu_);
  listeners_.Add(std::move(listener));
  Snapshot snap;
  snap.state = state_;
  snap.size = static_cast<int64_t>(events_.size());
  return snap;
}

bool JobEventLog::Read(int64_t index, v1::JobEvent* out) const {
  absl::MutexLock lock(&mu_);
  if (index < 0 || index >= static_cast<int64_t>(events_.size())) return false;
  *out = events_[index];
  return true;
}

}  // namespace trainyard
