// WorkerLink, the controller's end of one worker's stream, and
// WorkerOutbox, the queue of what the JobManager sends through such links.
//
// Messages to workers are queued while the manager's lock is held and
// delivered, in order, after it is released, so a link may call back into
// the manager from Send or Close.
//
// Thread safety: the *Locked methods need the manager's mutex (the one
// given at construction); Deliver takes it itself and must be called
// without it.
#ifndef TRAINYARD_CONTROLLER_WORKER_OUTBOX_H_
#define TRAINYARD_CONTROLLER_WORKER_OUTBOX_H_

#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

// The controller's end of one worker's stream (the gRPC layer implements
// it over the Connect stream; tests may fake it).
class WorkerLink {
 public:
  virtual ~WorkerLink() = default;
  // Queues `msg` to the worker; never blocks. Ignored after Close.
  virtual void Send(const v1::ControllerMessage& msg) = 0;
  // Ends the stream with `status`; idempotent.
  virtual void Close(const absl::Status& status) = 0;
};

// CancelStage: stop the worker's stage of `job_id`, saying why.
v1::ControllerMessage CancelStageMessage(const std::string& job_id,
                                         const std::string& reason);

class WorkerOutbox {
 public:
  // `mu` (not owned) is the lock the senders hold.
  explicit WorkerOutbox(absl::Mutex* mu) : mu_(*mu) {}
  WorkerOutbox(const WorkerOutbox&) = delete;
  WorkerOutbox& operator=(const WorkerOutbox&) = delete;

  // Queues `msg` to `link`.
  void SendLocked(std::shared_ptr<WorkerLink> link, v1::ControllerMessage msg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the end of `link`'s stream with `status`.
  void CloseLocked(std::shared_ptr<WorkerLink> link, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends everything queued, in order; safe to re-enter (a call made while
  // another thread delivers leaves its messages to that thread).
  void Deliver() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Outgoing {
    std::shared_ptr<WorkerLink> link;
    bool close = false;
    v1::ControllerMessage msg;
    absl::Status status;
  };

  absl::Mutex& mu_;
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mu_);
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_WORKER_OUTBOX_H_
