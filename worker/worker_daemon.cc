#include "worker/worker_daemon.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/device.h"
#include "core/status_macros.h"
#include "engine/job_log.h"
#include "glog/logging.h"
#include "kernels/blas.h"
#include "kernels/exec_context.h"
#include "proto/trainyard.pb.h"
#include "transport/tcp_transport.h"
#include "worker/active_job.h"
#include "worker/assignment_runner.h"
#include "worker/controller_stream.h"
#include "worker/health_server.h"
#include "worker/report_messages.h"
#include "worker/report_outbox.h"
#include "worker/snapshot_cache.h"
#include "worker/stage_transport.h"
#include "worker/worker_metrics.h"

namespace trainyard {
namespace {

using ::trainyard::v1::CancelStage;
using ::trainyard::v1::StageAssignment;

// How long StartJob waits for an aborted job to finish before refusing the
// next assignment: at least 15 s, and longer than a peer connect can take.
absl::Duration AbortedJobWait(absl::Duration peer_connect_timeout) {
  return std::max(absl::Seconds(15), peer_connect_timeout + absl::Seconds(5));
}

}  // namespace

// The daemon: owns the parts (the controller stream, the outbox, the
// snapshot cache, the transports, the assignment runner, the servers) and
// the one job slot: which stage runs, on which thread, and how it ends.
class Worker::Impl : public ControllerStream::Delegate {
 public:
  // `options` are validated (ValidateWorkerOptions).
  explicit Impl(WorkerOptions options)
      : options_(std::move(options)),
        device_(*ParseDevice(options_.device)),
        outbox_(options_.name),
        snapshots_(options_.name) {}
  ~Impl() override { Shutdown(); }

  absl::Status Init();
  void Shutdown();
  void Drain(absl::Duration grace);

  std::string peer_address() const { return peer_address_; }
  int health_port() const { return health_ ? health_->port() : 0; }
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  std::string worker_id() const { return stream_->worker_id(); }
  int64_t registrations() const { return stream_->registrations(); }
  bool busy() const {
    absl::MutexLock lock(&mu_);
    return job_ != nullptr && !job_finished_;
  }

  // ControllerStream::Delegate.
  void ClaimStage(v1::RegisterWorker* registration) override;
  void OnRegistered(Session* session,
                    const v1::WorkerRegistered& registered) override;
  void OnAssign(Session* session, const StageAssignment& assignment) override;
  void OnCancel(const CancelStage& cancel) override;
  void OnRendezvousReply(const v1::RendezvousReply& reply) override;
  void OnStreamEnded(Session* session) override;

 private:
  // Fails at start, not at the first assignment, when the GPU is unusable.
  absl::Status CheckDevice() const;
  // The peer listener (or the injected TCP seam) and the NCCL factory.
  absl::Status OpenTransports();
  // Stops a running stage once the worker has been cut off from the
  // controller for longer than its adopt timeout (WorkerRegistered).
  void OrphanWatchdog();
  // Starts `assignment` on a new job thread and hands the finished job's
  // thread to `finished`; or, when a stage still runs or the worker
  // drains, returns what it is busy with.
  std::string StartJob(const StageAssignment& assignment,
                       std::thread* finished);
  void RunJob(StageAssignment assignment, std::shared_ptr<ActiveJob> job);
  // Aborts the running stage (if any) and joins its thread.
  void StopJob(const absl::Status& reason);

  WorkerOptions options_;
  const Device device_;
  ReportOutbox outbox_;
  SnapshotCache snapshots_;
  // Sends the lines logged about a running job (engine/job_log.h).
  std::unique_ptr<JobLogForwarder> job_log_;
  std::string peer_address_;
  std::unique_ptr<PeerListener> listener_;
  std::unique_ptr<StageTransports> transports_;
  std::unique_ptr<WorkerMetrics> metrics_;  // null without --metrics_listen
  std::unique_ptr<HealthServer> health_;    // null without --health_listen
  std::unique_ptr<AssignmentRunner> runner_;
  std::unique_ptr<ControllerStream> stream_;

  absl::Notification shutdown_;
  std::thread watchdog_thread_;
  std::once_flag shutdown_once_;

  // The job slot. Lock order: mu_ before the outbox's.
  mutable absl::Mutex mu_;
  std::shared_ptr<ActiveJob> job_ ABSL_GUARDED_BY(mu_);
  bool job_finished_ ABSL_GUARDED_BY(mu_) = true;
  // Its StageDone has been handed to the stream (Drain waits for it).
  bool job_reported_ ABSL_GUARDED_BY(mu_) = false;
  // Drain was called: no new stage, no reconnect.
  std::atomic<bool> draining_{false};
  std::thread job_thread_ ABSL_GUARDED_BY(mu_);
};

absl::Status Worker::Impl::Init() {
  RETURN_IF_ERROR(CheckDevice());
  if (options_.threads > 0) SetBlasThreads(options_.threads);
  JobLogOptions log_options;
  log_options.drop_prefix =
      absl::StrCat("trainyard-worker ", options_.name, ": ");
  job_log_ = std::make_unique<JobLogForwarder>(
      [this](const v1::WorkerMessage& m) { return outbox_.SendLive(m); },
      std::move(log_options));
  RETURN_IF_ERROR(OpenTransports());
  if (!options_.metrics_listen.empty()) {
    ASSIGN_OR_RETURN(metrics_,
                     WorkerMetrics::Start(options_.metrics_listen, device_,
                                          [this] { return busy(); }));
  }
  if (!options_.health_listen.empty()) {
    ASSIGN_OR_RETURN(health_,
                     HealthServer::Start(options_.health_listen, options_.tls));
  }
  runner_ = std::make_unique<AssignmentRunner>(AssignmentRunner::Parts{
      &options_, device_, peer_address_, transports_.get(), &outbox_,
      &snapshots_, metrics_.get(), job_log_.get()});
  LOG(INFO) << "trainyard-worker " << options_.name << ": peers dial "
            << peer_address_ << ", health port " << health_port()
            << ", plugins in " << options_.plugin_dir << ", controller "
            << options_.controller;
  stream_ = std::make_unique<ControllerStream>(options_, peer_address_,
                                               health_.get(), this);
  stream_->Start();
  watchdog_thread_ = std::thread([this] { OrphanWatchdog(); });
  return absl::OkStatus();
}

absl::Status Worker::Impl::CheckDevice() const {
  if (!device_.is_cuda() || !options_.check_device) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<ExecContext>> probe =
      ExecContext::Create(device_, Precision::kFp32);
  if (!probe.ok()) {
    return Prefixed(probe.status(),
                    absl::StrCat("--device ", device_.ToString(), ": "));
  }
  return absl::OkStatus();
}

absl::Status Worker::Impl::OpenTransports() {
  NcclTransportFactory create_nccl = options_.create_nccl_transport
                                         ? options_.create_nccl_transport
                                         : DefaultNcclTransportFactory();
  TransportFactory connect;
  if (options_.connect_transport) {
    connect = options_.connect_transport;
    peer_address_ = options_.peer_address;
  } else {
    absl::StatusOr<std::unique_ptr<PeerListener>> listener =
        PeerListener::Listen(options_.listen);
    if (!listener.ok()) return Prefixed(listener.status(), "--listen: ");
    listener_ = std::move(*listener);
    peer_address_ = options_.advertise_address.empty()
                        ? listener_->address()
                        : options_.advertise_address;
    connect =
        TcpTransportFactory(listener_.get(), options_.peer_connect_timeout);
  }
  transports_ = std::make_unique<StageTransports>(
      options_, device_, std::move(connect), std::move(create_nccl), &outbox_);
  return absl::OkStatus();
}

void Worker::Impl::Drain(absl::Duration grace) {
  // No new stage from now on: refused here, and the controller is told.
  draining_.store(true);
  stream_->StopReconnecting();
  outbox_.SendLive(HeartbeatMessage(/*draining=*/true));
  std::shared_ptr<ActiveJob> job;
  {
    absl::MutexLock lock(&mu_);
    if (job_ == nullptr || job_finished_) return;
    job = job_;
  }
  LOG(INFO) << "trainyard-worker " << options_.name << ": asked to stop; job "
            << job->job_id() << " stage " << job->stage()
            << " finishes its current step (up to "
            << absl::FormatDuration(grace) << ")";
  job->StopAfterStep(absl::UnavailableError(absl::StrCat(
      "worker ", options_.name,
      " is shutting down (asked to stop): its stage ended after finishing "
      "its current step")));
  const absl::Time deadline = absl::Now() + grace;
  {
    absl::MutexLock lock(&mu_);
    auto reported = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return job_reported_;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&reported), deadline)) {
      LOG(WARNING) << "trainyard-worker " << options_.name << ": job "
                   << job->job_id() << " did not finish its step within "
                   << absl::FormatDuration(grace) << "; stopping it";
      return;
    }
  }
  // Half-close the stream, so the controller reads the StageDone (why this
  // worker leaves) before it sees the stream end; wait, within the grace,
  // for that session to end (its reader sees the controller close).
  outbox_.CloseLive(deadline);
}

void Worker::Impl::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    shutdown_.Notify();
    if (stream_ != nullptr) stream_->Stop();
    if (watchdog_thread_.joinable()) watchdog_thread_.join();
    // No session runs now, but a job may have started and ended without one.
    StopJob(absl::CancelledError("worker shutting down"));
    if (health_ != nullptr) health_->Shutdown();
    // Its collector reads this object: stop it before the members go.
    metrics_.reset();
  });
}

void Worker::Impl::ClaimStage(v1::RegisterWorker* registration) {
  absl::MutexLock lock(&mu_);
  const bool unsent = outbox_.has_kept();
  if (job_ != nullptr && (!job_finished_ || unsent)) {
    v1::StageClaim* claim = registration->mutable_running();
    claim->set_job_id(job_->job_id());
    claim->set_stage(job_->stage());
    claim->set_attempt(job_->attempt());
  }
}

void Worker::Impl::OnRegistered(Session* session,
                                const v1::WorkerRegistered& registered) {
  // Resend every kept report, in order, before any new one.
  outbox_.Attach(session, absl::Milliseconds(registered.adopt_timeout_ms()));
}

void Worker::Impl::OnStreamEnded(Session* session) {
  // A running stage goes on: its reports are kept until the next
  // registration (a controller restart loses nothing).
  outbox_.Detach(session);
  // A rendezvous needs the controller: one waiting on this stream fails
  // now instead of waiting out its timeout.
  absl::MutexLock lock(&mu_);
  if (job_ != nullptr && !job_finished_) {
    job_->FailRendezvous(absl::UnavailableError(absl::StrCat(
        "worker ", options_.name, " lost its connection to the controller at ",
        options_.controller)));
  }
}

void Worker::Impl::OrphanWatchdog() {
  while (!shutdown_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    const std::optional<ReportOutbox::CutOff> cut_off = outbox_.cut_off();
    if (!cut_off.has_value() || cut_off->away <= cut_off->limit) continue;
    absl::MutexLock lock(&mu_);
    if (job_ == nullptr || job_finished_ || !job_->abort_reason().first.ok()) {
      continue;
    }
    ScopedJobLog scope(job_log_.get(), job_->job_id(), job_->stage());
    LOG(WARNING) << "trainyard-worker " << options_.name
                 << ": no controller for "
                 << absl::FormatDuration(cut_off->away) << "; stopping job "
                 << job_->job_id() << " stage " << job_->stage();
    job_->Abort(absl::UnavailableError(absl::StrCat(
                    "worker ", options_.name,
                    " was cut off from the "
                    "controller for more than ",
                    absl::FormatDuration(cut_off->limit),
                    ": its stage may have been given to another worker")),
                /*cancelled=*/false);
  }
}

void Worker::Impl::OnAssign(Session* session,
                            const StageAssignment& assignment) {
  std::thread finished;
  const std::string busy_with = StartJob(assignment, &finished);
  // The finished job has reported already; its thread is exiting.
  if (finished.joinable()) finished.join();
  if (busy_with.empty()) return;
  ScopedJobLog scope(job_log_.get(), assignment.job_id(), assignment.rank());
  const absl::Status busy = absl::UnavailableError(
      draining_.load()
          ? absl::StrCat("worker ", options_.name, " is shutting down")
          : absl::StrCat("worker ", options_.name, " busy with job ",
                         busy_with));
  LOG(WARNING) << "trainyard-worker " << options_.name << ": refusing job "
               << assignment.job_id() << ": " << busy.message();
  session->Write(DoneMessage(assignment.job_id(), assignment.rank(), busy,
                             std::string(busy.message()), false));
}

std::string Worker::Impl::StartJob(const StageAssignment& assignment,
                                   std::thread* finished) {
  absl::MutexLock lock(&mu_);
  // The controller frees a worker as soon as it cancels or fails its job,
  // so the next assignment may arrive while the aborted stage is still
  // winding down (normally milliseconds: a stage still connecting to its
  // peers sees the cancel flag within 50 ms). Wait for it, boundedly, and
  // never for less than a connect could take should the cancel not reach
  // it.
  if (job_ != nullptr && !job_finished_ && !job_->abort_reason().first.ok()) {
    auto finished_cond = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return job_finished_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&finished_cond),
                         AbortedJobWait(options_.peer_connect_timeout));
  }
  if (draining_.load()) return "(shutting down)";
  if (job_ != nullptr && !job_finished_) return job_->job_id();
  *finished = std::move(job_thread_);
  auto job = std::make_shared<ActiveJob>(assignment.job_id(), assignment.rank(),
                                         assignment.attempt());
  job_ = job;
  job_finished_ = false;
  job_reported_ = false;
  // The previous job's reports were resent at registration.
  outbox_.StartJob();
  job_thread_ =
      std::thread([this, assignment, job] { RunJob(assignment, job); });
  return "";
}

void Worker::Impl::OnCancel(const CancelStage& cancel) {
  absl::MutexLock lock(&mu_);
  if (job_ != nullptr && job_finished_ && job_->job_id() == cancel.job_id()) {
    // The controller refused our claim on a stage that has ended: the
    // kept reports are of no use to it, and need not be claimed again.
    outbox_.DropKept();
  }
  if (job_ == nullptr || job_finished_ || job_->job_id() != cancel.job_id()) {
    LOG(INFO) << "trainyard-worker " << options_.name << ": cancel for job "
              << cancel.job_id() << ", which is not running here; ignored";
    return;
  }
  const std::string reason = cancel.reason().empty()
                                 ? std::string("cancelled by the controller")
                                 : cancel.reason();
  ScopedJobLog scope(job_log_.get(), job_->job_id(), job_->stage());
  LOG(INFO) << "trainyard-worker " << options_.name << ": cancelling job "
            << cancel.job_id() << ": " << reason;
  job_->Abort(absl::CancelledError(reason), /*cancelled=*/true);
}

void Worker::Impl::OnRendezvousReply(const v1::RendezvousReply& reply) {
  absl::MutexLock lock(&mu_);
  if (job_ == nullptr || job_finished_ ||
      !job_->DeliverRendezvousReply(reply)) {
    LOG(INFO) << "trainyard-worker " << options_.name << ": rendezvous reply "
              << reply.request_id() << " came after its call ended; dropped";
  }
}

void Worker::Impl::StopJob(const absl::Status& reason) {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    if (job_ != nullptr && !job_finished_) {
      ScopedJobLog scope(job_log_.get(), job_->job_id(), job_->stage());
      LOG(WARNING) << "trainyard-worker " << options_.name << ": aborting job "
                   << job_->job_id() << ": " << reason.message();
      job_->Abort(reason, /*cancelled=*/false);
    }
    thread = std::move(job_thread_);
  }
  if (thread.joinable()) thread.join();
}

void Worker::Impl::RunJob(StageAssignment assignment,
                          std::shared_ptr<ActiveJob> job) {
  // Everything this thread logs from here on is about the job.
  ScopedJobLog scope(job_log_.get(), job->job_id(), job->stage());
  LOG(INFO) << "trainyard-worker " << options_.name << ": starting job "
            << job->job_id() << " stage " << job->stage() << " (attempt "
            << job->attempt() << ")";
  absl::Status status = runner_->Run(assignment, job.get());
  const auto [reason, cancelled] = job->abort_reason();
  std::string error;
  bool was_cancelled = false;
  if (!status.ok()) {
    if (cancelled) {
      was_cancelled = true;
      error = std::string(reason.message());
    } else {
      // Stopped by the worker itself (shutting down, cut off from the
      // controller): that is the cause, not the stage's "cancelled".
      if (!reason.ok()) status = reason;
      error =
          absl::StrCat("job ", job->job_id(), " stage ", job->stage(),
                       " on worker ", options_.name, ": ", status.message());
    }
    LOG(WARNING) << "trainyard-worker " << options_.name << ": job "
                 << job->job_id() << " stage " << job->stage()
                 << (was_cancelled ? " cancelled: " : " failed: ") << error;
  } else {
    LOG(INFO) << "trainyard-worker " << options_.name << ": job "
              << job->job_id() << " stage " << job->stage() << " done";
  }
  {
    // Idle before reporting, so the controller may assign the next job as
    // soon as it reads StageDone.
    absl::MutexLock lock(&mu_);
    job_finished_ = true;
  }
  // The job's lines go before its end: the controller takes no lines of a
  // stage that has ended.
  job_log_->Flush();
  outbox_.Report(
      DoneMessage(job->job_id(), job->stage(), status, error, was_cancelled));
  absl::MutexLock lock(&mu_);
  job_reported_ = true;
}

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Worker::~Worker() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(WorkerOptions options) {
  ASSIGN_OR_RETURN(WorkerOptions valid,
                   ValidateWorkerOptions(std::move(options)));
  auto impl = std::make_unique<Impl>(std::move(valid));
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Worker>(new Worker(std::move(impl)));
}

void Worker::Shutdown() { impl_->Shutdown(); }
void Worker::Drain(absl::Duration grace) { impl_->Drain(grace); }
std::string Worker::peer_address() const { return impl_->peer_address(); }
int Worker::health_port() const { return impl_->health_port(); }
int Worker::metrics_port() const { return impl_->metrics_port(); }
std::string Worker::worker_id() const { return impl_->worker_id(); }
int64_t Worker::registrations() const { return impl_->registrations(); }
bool Worker::busy() const { return impl_->busy(); }

absl::Status RunWorker(const WorkerOptions& options, absl::Notification* stop,
                       const std::function<void(const Worker&)>& on_started) {
  ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, Worker::Start(options));
  if (on_started) on_started(*worker);
  if (stop != nullptr) {
    stop->WaitForNotification();
  } else {
    absl::Notification never;
    never.WaitForNotification();
  }
  worker->Drain(options.shutdown_grace);
  worker->Shutdown();
  return absl::OkStatus();
}

}  // namespace trainyard
