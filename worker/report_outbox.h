// ReportOutbox: a worker's reports on their way to the controller. A stage
// report (step, eval, transport, start, held state, end) is written to the
// live registered session when there is one, and kept, without its span
// trace, for resending after a reconnect: a stage keeps training while the
// controller is away, and a restarted controller loses nothing. The kept
// reports are the current job's (at most kMaxKeptReports, the oldest
// dropped first).
//
// Thread safety: every method may be called from any thread.
#ifndef TRAINYARD_WORKER_REPORT_OUTBOX_H_
#define TRAINYARD_WORKER_REPORT_OUTBOX_H_

#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/trainyard.pb.h"
#include "worker/controller_stream.h"

namespace trainyard {

class ReportOutbox {
 public:
  // The most reports kept for resending after a reconnect (every report of
  // the current job, normally): a controller away for longer than this
  // many reports misses the oldest ones.
  static constexpr size_t kMaxKeptReports = 16384;

  // `worker_name` starts the lines it logs.
  explicit ReportOutbox(std::string worker_name)
      : worker_name_(std::move(worker_name)) {}

  // A stage report: written now when a registered session is live, and
  // kept.
  void Report(const v1::WorkerMessage& message);
  // Writes to the live registered session, keeping nothing; false when
  // there is none (or the write failed).
  bool SendLive(const v1::WorkerMessage& message);
  // Whether a registered session is live.
  bool live() const;

  // `session` was registered: every kept report is resent, in order,
  // before any new one; the controller adopts a worker cut off for no
  // longer than `adopt_timeout` (0: forever).
  void Attach(Session* session, absl::Duration adopt_timeout);
  // `session`'s stream ended: reports are only kept from now on.
  void Detach(Session* session);
  // How long no registered session has been live, and the adopt timeout
  // it counts against; nullopt while one is, or when there is no timeout.
  struct CutOff {
    absl::Duration away;
    absl::Duration limit;
  };
  std::optional<CutOff> cut_off() const;
  // Half-closes the live session's stream and waits until `deadline` for
  // it to end (its reader sees the controller close).
  void CloseLive(absl::Time deadline);

  // Whether reports are kept for resending.
  bool has_kept() const;
  // Drops the kept reports (the controller refused the stage's claim).
  void DropKept();
  // A new job: the previous job's reports were resent at registration.
  void StartJob();

 private:
  const std::string worker_name_;
  mutable absl::Mutex mu_;
  std::deque<v1::WorkerMessage> kept_ ABSL_GUARDED_BY(mu_);
  // kMaxKeptReports was passed this job, with a live session / without.
  bool told_limit_ ABSL_GUARDED_BY(mu_) = false;
  bool told_unsent_ ABSL_GUARDED_BY(mu_) = false;
  Session* live_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Time disconnected_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Duration adopt_timeout_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_REPORT_OUTBOX_H_
