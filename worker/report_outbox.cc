#include "worker/report_outbox.h"

#include "absl/time/clock.h"
#include "glog/logging.h"

namespace trainyard {

void ReportOutbox::Report(const v1::WorkerMessage& message) {
  absl::MutexLock lock(&mu_);
  if (live_ != nullptr) live_->Write(message);
  // Kept without its span trace: a job's reports are kept for its whole
  // run, and traces are what a live controller shows, not history.
  kept_.push_back(message);
  if (kept_.back().has_step()) {
    kept_.back().mutable_step()->clear_trace();
  } else if (kept_.back().has_eval()) {
    kept_.back().mutable_eval()->clear_trace();
  }
  if (kept_.size() > kMaxKeptReports) {
    kept_.pop_front();
    // Each said once per job. Every job longer than this gets here while
    // the controller hears every report; only a controller away that long
    // misses some.
    if (live_ != nullptr && !told_limit_) {
      told_limit_ = true;
      LOG(INFO) << "trainyard-worker " << worker_name_
                << ": keeping only the newest " << kMaxKeptReports
                << " reports for resending after a reconnect";
    } else if (live_ == nullptr && !told_unsent_) {
      told_unsent_ = true;
      LOG(WARNING) << "trainyard-worker " << worker_name_
                   << ": the controller has been away for more than "
                   << kMaxKeptReports
                   << " reports; the oldest are dropped unsent";
    }
  }
}

bool ReportOutbox::SendLive(const v1::WorkerMessage& message) {
  absl::MutexLock lock(&mu_);
  return live_ != nullptr && live_->Write(message);
}

bool ReportOutbox::live() const {
  absl::MutexLock lock(&mu_);
  return live_ != nullptr;
}

void ReportOutbox::Attach(Session* session, absl::Duration adopt_timeout) {
  absl::MutexLock lock(&mu_);
  live_ = session;
  disconnected_since_ = absl::InfiniteFuture();
  adopt_timeout_ = adopt_timeout;
  // What the old controller had already published is dropped by the new
  // one.
  for (const v1::WorkerMessage& m : kept_) {
    if (!session->Write(m)) break;  // the reader sees the stream end
  }
}

void ReportOutbox::Detach(Session* session) {
  absl::MutexLock lock(&mu_);
  if (live_ == session) {
    live_ = nullptr;
    disconnected_since_ = absl::Now();
  }
}

std::optional<ReportOutbox::CutOff> ReportOutbox::cut_off() const {
  absl::MutexLock lock(&mu_);
  if (live_ != nullptr || adopt_timeout_ <= absl::ZeroDuration()) {
    return std::nullopt;
  }
  return CutOff{absl::Now() - disconnected_since_, adopt_timeout_};
}

void ReportOutbox::CloseLive(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  Session* const session = live_;
  if (session == nullptr) return;
  session->CloseWrites();
  auto ended = [this, session]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return live_ != session;
  };
  mu_.AwaitWithDeadline(absl::Condition(&ended), deadline);
}

bool ReportOutbox::has_kept() const {
  absl::MutexLock lock(&mu_);
  return !kept_.empty();
}

void ReportOutbox::DropKept() {
  absl::MutexLock lock(&mu_);
  kept_.clear();
}

void ReportOutbox::StartJob() {
  absl::MutexLock lock(&mu_);
  kept_.clear();
  told_limit_ = false;
  told_unsent_ = false;
}

}  // namespace trainyard
