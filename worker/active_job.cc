#include "worker/active_job.h"

#include "absl/strings/str_cat.h"

namespace trainyard {

void ActiveJob::Abort(const absl::Status& reason, bool cancelled) {
  absl::MutexLock lock(&mu_);
  if (reason_.ok()) {
    reason_ = reason;
    cancelled_ = cancelled;
  }
  cancel_.store(true);
  if (transport_ != nullptr) transport_->Abort(reason);
  if (rendezvous_ != nullptr) rendezvous_->Abort(reason);
}

void ActiveJob::StopAfterStep(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (reason_.ok()) {
    reason_ = reason;
    cancelled_ = false;
  }
  cancel_.store(true);
}

void ActiveJob::SetTransport(Transport* transport) {
  absl::MutexLock lock(&mu_);
  transport_ = transport;
  if (transport_ != nullptr && !reason_.ok()) transport_->Abort(reason_);
}

void ActiveJob::SetRendezvous(RemoteRendezvous* rendezvous) {
  absl::MutexLock lock(&mu_);
  rendezvous_ = rendezvous;
  if (rendezvous_ != nullptr && !reason_.ok()) rendezvous_->Abort(reason_);
}

void ActiveJob::FailRendezvous(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (rendezvous_ != nullptr) rendezvous_->Abort(why);
}

bool ActiveJob::DeliverRendezvousReply(const v1::RendezvousReply& reply) {
  absl::MutexLock lock(&mu_);
  if (rendezvous_ == nullptr) return false;
  if (reply.code() == 0) {
    rendezvous_->OnReply(reply.request_id(), reply.value());
    return true;
  }
  const absl::StatusCode code =
      reply.code() > 0 && reply.code() <= 16
          ? static_cast<absl::StatusCode>(reply.code())
          : absl::StatusCode::kUnknown;
  rendezvous_->OnReply(
      reply.request_id(),
      absl::Status(code, reply.error().empty()
                             ? absl::StrCat("rendezvous: the controller "
                                            "refused, code ",
                                            reply.code())
                             : reply.error()));
  return true;
}

std::pair<absl::Status, bool> ActiveJob::abort_reason() const {
  absl::MutexLock lock(&mu_);
  return {reason_, cancelled_};
}

}  // namespace trainyard
