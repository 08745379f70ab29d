#include "worker/controller_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/host_info.h"
#include "glog/logging.h"
#include "security/tls.h"
#include "worker/report_messages.h"

namespace trainyard {

ControllerStream::ControllerStream(const WorkerOptions& options,
                                   std::string peer_address,
                                   HealthServer* health, Delegate* delegate)
    : options_(options),
      peer_address_(std::move(peer_address)),
      health_(health),
      delegate_(delegate) {}

ControllerStream::~ControllerStream() { Stop(); }

void ControllerStream::Start() {
  thread_ = std::thread([this] { ConnectionLoop(); });
}

void ControllerStream::Stop() {
  std::call_once(stop_once_, [this] {
    {
      absl::MutexLock lock(&mu_);
      shutting_down_ = true;
      if (session_ != nullptr) session_->context.TryCancel();
    }
    shutdown_.Notify();
    if (thread_.joinable()) thread_.join();
  });
}

std::string ControllerStream::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

int64_t ControllerStream::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

void ControllerStream::ConnectionLoop() {
  absl::Duration backoff = options_.min_backoff;
  int attempt = 0;
  while (!shutdown_.HasBeenNotified()) {
    ++attempt;
    const bool registered = RunSession(attempt);
    if (health_ != nullptr) health_->SetRegistered(false);
    if (shutdown_.HasBeenNotified() || stop_reconnecting_.load()) break;
    if (registered) {
      backoff = options_.min_backoff;
      attempt = 0;
    }
    LOG(WARNING) << "trainyard-worker " << options_.name << ": reconnecting to "
                 << options_.controller << " in "
                 << absl::FormatDuration(backoff);
    shutdown_.WaitForNotificationWithTimeout(backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

bool ControllerStream::RunSession(int attempt) {
  auto session = std::make_unique<Session>();
  if (!BeginSession(session.get())) return false;
  LOG(INFO) << "trainyard-worker " << options_.name << ": connecting to "
            << options_.controller << " (attempt " << attempt << ")";
  // The files were checked by ValidateWorkerOptions; a failure here (a file
  // changed since) ends this attempt, and the loop retries.
  absl::StatusOr<std::unique_ptr<v1::WorkerService::Stub>> stub = Dial();
  if (!stub.ok()) {
    LOG(ERROR) << "trainyard-worker " << options_.name << ": "
               << stub.status().message();
    EndSession();
    return false;
  }
  session->stream = (*stub)->Connect(&session->context);
  std::thread heartbeat([this, s = session.get()] { HeartbeatLoop(s); });
  session->Write(Hello());  // a failure shows up as the end of the stream
  const bool registered = Serve(session.get());
  {
    absl::MutexLock lock(&session->mu);
    session->done = true;
    session->cv.SignalAll();
  }
  delegate_->OnStreamEnded(session.get());
  heartbeat.join();
  const grpc::Status status = session->stream->Finish();
  EndSession();
  if (!shutdown_.HasBeenNotified()) {
    LOG(WARNING) << "trainyard-worker " << options_.name << ": stream to "
                 << options_.controller << " ended"
                 << (registered ? "" : " before registration") << ": "
                 << (status.ok() ? std::string("OK")
                                 : absl::StrCat(status.error_code(), " ",
                                                status.error_message()));
  }
  return registered;
}

bool ControllerStream::BeginSession(Session* session) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return false;
  session_ = session;
  return true;
}

void ControllerStream::EndSession() {
  absl::MutexLock lock(&mu_);
  session_ = nullptr;
}

absl::StatusOr<std::unique_ptr<v1::WorkerService::Stub>>
ControllerStream::Dial() {
  // HTTP/2 keepalive pings: a controller that vanished or froze without
  // closing the connection breaks the stream within ~15 s (blocked report
  // writes fail, the stage is aborted, the worker reconnects) instead of
  // after the kernel's TCP timeouts.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      MakeChannelCredentials(options_.tls, &args);
  if (!creds.ok()) return creds.status();
  return v1::WorkerService::NewStub(
      grpc::CreateCustomChannel(options_.controller, *creds, args));
}

v1::WorkerMessage ControllerStream::Hello() {
  v1::WorkerMessage hello;
  v1::RegisterWorker* reg = hello.mutable_register_();
  reg->set_name(options_.name);
  v1::WorkerCapabilities* caps = reg->mutable_capabilities();
  caps->set_device(options_.device);
  caps->set_memory_bytes(options_.memory_bytes);
  caps->set_peer_address(peer_address_);
  caps->set_threads(
      options_.threads > 0
          ? options_.threads
          : static_cast<int>(std::thread::hardware_concurrency()));
  caps->set_hostname(Hostname());
  // A reconnecting worker keeps its id and claims the stage it still runs
  // (or ran, with reports to resend): a restarted controller re-adopts it.
  reg->set_worker_id(worker_id());
  delegate_->ClaimStage(reg);
  return hello;
}

bool ControllerStream::Serve(Session* session) {
  v1::ControllerMessage message;
  bool registered = false;
  while (session->stream->Read(&message)) {
    if (message.has_registered()) {
      OnRegistered(session, message.registered());
      registered = true;
    } else if (!registered) {
      LOG(ERROR) << "trainyard-worker: controller " << options_.controller
                 << " sent " << message.msg_case()
                 << " before WorkerRegistered; reconnecting";
      session->context.TryCancel();
    } else if (message.has_assign()) {
      delegate_->OnAssign(session, message.assign());
    } else if (message.has_cancel()) {
      delegate_->OnCancel(message.cancel());
    } else if (message.has_rendezvous_reply()) {
      delegate_->OnRendezvousReply(message.rendezvous_reply());
    } else {
      LOG(WARNING) << "trainyard-worker: ignoring an unknown controller "
                      "message (field "
                   << message.msg_case() << ")";
    }
  }
  return registered;
}

void ControllerStream::OnRegistered(Session* session,
                                    const v1::WorkerRegistered& registered) {
  {
    absl::MutexLock lock(&session->mu);
    session->registered = true;
    if (registered.heartbeat_interval_ms() > 0) {
      session->heartbeat_interval_ms = registered.heartbeat_interval_ms();
    }
    session->cv.SignalAll();
  }
  if (health_ != nullptr) health_->SetRegistered(true);
  delegate_->OnRegistered(session, registered);
  absl::MutexLock lock(&mu_);
  worker_id_ = registered.worker_id();
  ++registrations_;
  LOG(INFO) << "trainyard-worker " << options_.name << ": registered as "
            << worker_id_ << " with " << options_.controller
            << ", heartbeat every " << registered.heartbeat_interval_ms()
            << " ms";
}

bool ControllerStream::AwaitRegistration(Session* session) {
  absl::MutexLock lock(&session->mu);
  const absl::Time deadline = absl::Now() + options_.register_timeout;
  while (!session->registered && !session->done) {
    if (session->cv.WaitWithDeadline(&session->mu, deadline)) break;
  }
  if (session->done) return false;
  if (!session->registered) {
    LOG(WARNING) << "trainyard-worker " << options_.name
                 << ": no WorkerRegistered from " << options_.controller
                 << " within "
                 << absl::FormatDuration(options_.register_timeout);
    session->context.TryCancel();
    return false;
  }
  return true;
}

void ControllerStream::HeartbeatLoop(Session* session) {
  if (!AwaitRegistration(session)) return;
  while (true) {
    {
      absl::MutexLock lock(&session->mu);
      const absl::Time deadline =
          absl::Now() + absl::Milliseconds(session->heartbeat_interval_ms);
      while (!session->done) {
        if (session->cv.WaitWithDeadline(&session->mu, deadline)) break;
      }
      if (session->done) return;
    }
    if (!session->Write(HeartbeatMessage(/*draining=*/false))) {
      // A broken stream is cancelled, so the reader stops waiting; a
      // half-closed one is left to end when the controller has read it.
      if (!session->closed_writes()) session->context.TryCancel();
      return;
    }
  }
}

}  // namespace trainyard
