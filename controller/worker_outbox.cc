#include "controller/worker_outbox.h"

#include <utility>

namespace trainyard {

v1::ControllerMessage CancelStageMessage(const std::string& job_id,
                                         const std::string& reason) {
  v1::ControllerMessage msg;
  msg.mutable_cancel()->set_job_id(job_id);
  msg.mutable_cancel()->set_reason(reason);
  return msg;
}

void WorkerOutbox::SendLocked(std::shared_ptr<WorkerLink> link,
                              v1::ControllerMessage msg) {
  Outgoing out;
  out.link = std::move(link);
  out.msg = std::move(msg);
  queue_.push_back(std::move(out));
}

void WorkerOutbox::CloseLocked(std::shared_ptr<WorkerLink> link,
                               absl::Status status) {
  Outgoing out;
  out.link = std::move(link);
  out.close = true;
  out.status = std::move(status);
  queue_.push_back(std::move(out));
}

void WorkerOutbox::Deliver() {
  {
    absl::MutexLock lock(&mu_);
    if (delivering_) return;  // the active deliverer will send ours too
    delivering_ = true;
  }
  while (true) {
    Outgoing out;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) {
        delivering_ = false;
        return;
      }
      out = std::move(queue_.front());
      queue_.pop_front();
    }
    if (out.close) {
      out.link->Close(out.status);
    } else {
      out.link->Send(out.msg);
    }
  }
}

}  // namespace trainyard
