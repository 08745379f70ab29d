#include "worker/fake_controller.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace trainyard {
namespace testing {

using ::trainyard::v1::ControllerMessage;
using ::trainyard::v1::WorkerMessage;

FakeController::FakeController(const std::string& address) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
}

std::string FakeController::address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

void FakeController::Stop() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
  server_.reset();
}

grpc::Status FakeController::Connect(grpc::ServerContext* context,
                                     Stream* stream) {
  WorkerMessage first;
  if (!stream->Read(&first) || !first.has_register_()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "first message must be RegisterWorker");
  }
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    id = absl::StrCat("w", ++connects_);
    streams_[id] = stream;
  }
  ControllerMessage reply;
  reply.mutable_registered()->set_worker_id(id);
  reply.mutable_registered()->set_heartbeat_interval_ms(kHeartbeatMs);
  reply.mutable_registered()->set_heartbeat_timeout_ms(10 * kHeartbeatMs);
  reply.mutable_registered()->set_adopt_timeout_ms(adopt_timeout_ms_);
  Send(id, reply);
  {
    // Counted only once the reply is out, so nothing the test sends can
    // overtake it.
    absl::MutexLock lock(&mu_);
    ++registrations_;
    registered_.push_back(first.register_());
    worker_ids_.push_back(id);
  }
  WorkerMessage message;
  while (stream->Read(&message)) {
    absl::Duration pause;
    {
      absl::MutexLock lock(&mu_);
      heard_.push_back({id, message});
      if (message.has_done()) pause = pause_after_done_;
    }
    absl::SleepFor(pause);
  }
  absl::MutexLock lock(&mu_);
  streams_.erase(id);
  ends_[id] =
      context->IsCancelled() ? StreamEnd::kCancelled : StreamEnd::kWritesClosed;
  return grpc::Status::OK;
}

bool FakeController::Send(const std::string& worker_id,
                          const ControllerMessage& message) {
  absl::MutexLock lock(&write_mu_);
  Stream* stream;
  {
    absl::MutexLock lock2(&mu_);
    auto it = streams_.find(worker_id);
    if (it == streams_.end()) return false;
    stream = it->second;
  }
  return stream->Write(message);
}

std::string FakeController::WaitForRegistration(int n, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return registrations_ >= n;
  };
  mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  return registrations_ >= n ? worker_ids_[n - 1] : "";
}

std::optional<v1::StageDone> FakeController::WaitForDone(
    const std::string& job_id, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto find = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    for (const Heard& h : heard_) {
      if (h.message.has_done() && h.message.done().job_id() == job_id) {
        return true;
      }
    }
    return false;
  };
  mu_.AwaitWithTimeout(absl::Condition(&find), timeout);
  for (const Heard& h : heard_) {
    if (h.message.has_done() && h.message.done().job_id() == job_id) {
      return h.message.done();
    }
  }
  return std::nullopt;
}

bool FakeController::WaitForSteps(const std::string& job_id, int count,
                                  absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    int n = 0;
    for (const Heard& h : heard_) {
      n += h.message.has_step() && h.message.step().job_id() == job_id;
    }
    return n >= count;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

int FakeController::Heartbeats(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const Heard& h : heard_) {
    n += h.worker_id == worker_id && h.message.has_heartbeat();
  }
  return n;
}

FakeController::StreamEnd FakeController::stream_end(
    const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = ends_.find(worker_id);
  return it == ends_.end() ? StreamEnd::kOpen : it->second;
}

std::vector<Heard> FakeController::heard() {
  absl::MutexLock lock(&mu_);
  return heard_;
}

std::vector<v1::RegisterWorker> FakeController::registered() {
  absl::MutexLock lock(&mu_);
  return registered_;
}

std::vector<std::string> FakeController::worker_ids() {
  absl::MutexLock lock(&mu_);
  return worker_ids_;
}

}  // namespace testing
}  // namespace trainyard
