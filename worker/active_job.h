// ActiveJob: the stage a worker is running and how to stop it: a cancel
// flag the stage loop and a connecting transport poll, the transport and
// the rendezvous to abort, and the first reason it was stopped for.
//
// Thread safety: every method may be called from any thread.
#ifndef TRAINYARD_WORKER_ACTIVE_JOB_H_
#define TRAINYARD_WORKER_ACTIVE_JOB_H_

#include <atomic>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "proto/trainyard.pb.h"
#include "transport/rendezvous.h"
#include "transport/transport.h"

namespace trainyard {

class ActiveJob {
 public:
  ActiveJob(std::string job_id, int stage, int attempt)
      : job_id_(std::move(job_id)), stage_(stage), attempt_(attempt) {}

  const std::string& job_id() const { return job_id_; }
  int stage() const { return stage_; }
  int attempt() const { return attempt_; }
  const std::atomic<bool>* cancel_flag() const { return &cancel_; }

  // Stops the stage: RunStage sees the flag before its next step, the
  // transport fails every wait at once (an NCCL one aborts its
  // communicators), a TCP transport still connecting (it polls the flag)
  // gives up, and an NCCL transport being created stops waiting for the
  // rendezvous. The first reason wins.
  void Abort(const absl::Status& reason, bool cancelled);

  // Lets the stage finish its current step, then end (RunStage sees the
  // flag before the next one) with `reason`; the transport is left alone so
  // the step's messages still flow. The first reason wins.
  void StopAfterStep(const absl::Status& reason);

  // Registers the transport to abort (null to unregister before it dies).
  void SetTransport(Transport* transport);

  // Registers the rendezvous of a transport being created (null to
  // unregister before it dies), which receives the controller's replies.
  void SetRendezvous(RemoteRendezvous* rendezvous);

  // Fails the pending and future requests of the rendezvous being used, if
  // any (the stream it goes over broke); the stage itself goes on.
  void FailRendezvous(const absl::Status& why);

  // Hands a RendezvousReply to the registered rendezvous; false when there
  // is none (a reply for a call that is over).
  bool DeliverRendezvousReply(const v1::RendezvousReply& reply);

  // The abort reason (OK if none) and whether it was a cancellation.
  std::pair<absl::Status, bool> abort_reason() const;

 private:
  const std::string job_id_;
  const int stage_;
  const int attempt_;
  std::atomic<bool> cancel_{false};
  mutable absl::Mutex mu_;
  Transport* transport_ ABSL_GUARDED_BY(mu_) = nullptr;
  RemoteRendezvous* rendezvous_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status reason_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_ACTIVE_JOB_H_
