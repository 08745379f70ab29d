#include "worker/worker_daemon.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "net/address.h"
#include "core/host_info.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/device.h"
#include "plan/job_plan.h"
#include "observability/prometheus_endpoint.h"
#include "transport/nccl_transport.h"
#include "transport/rendezvous.h"
#include "core/status_macros.h"
#include "transport/tcp_transport.h"
#include "transport/transport_select.h"
#include "glog/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "kernels/blas.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/exec_context.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "proto/trainyard.grpc.pb.h"
#include "proto/trainyard.pb.h"
#include "engine/job_log.h"
#include "engine/replica_group.h"
#include "engine/stage.h"
#include "engine/stage_runner.h"

namespace trainyard {
namespace {

// Health service name that is SERVING exactly while this worker is
// registered with its controller (the pods' readiness probe); the overall
// "" status is SERVING while the process runs (liveness).
constexpr char kRegisteredService[] = "trainyard.v1.WorkerRegistration";

using ::trainyard::v1::CancelStage;
using ::trainyard::v1::ControllerMessage;
using ::trainyard::v1::SnapshotResume;
using ::trainyard::v1::StageAssignment;
using ::trainyard::v1::WorkerMessage;
using ::trainyard::v1::WorkerService;
using Stream = grpc::ClientReaderWriter<trainyard::v1::WorkerMessage,
                                        trainyard::v1::ControllerMessage>;

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// One Connect stream and what the threads sharing it know about it.
struct Session {
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream;

  absl::Mutex write_mu;  // gRPC allows one writer at a time

  absl::Mutex mu;
  absl::CondVar cv;
  bool registered ABSL_GUARDED_BY(mu) = false;
  bool done ABSL_GUARDED_BY(mu) = false;  // the reader saw the stream end
  int64_t heartbeat_interval_ms ABSL_GUARDED_BY(mu) = 1000;

  // False once the stream is broken; the reader notices it too.
  bool Write(const WorkerMessage& message) {
    absl::MutexLock lock(&write_mu);
    return stream->Write(message);
  }
};

// The stage a worker is running and how to stop it.
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
  void Abort(const absl::Status& reason, bool cancelled) {
    absl::MutexLock lock(&mu_);
    if (reason_.ok()) {
      reason_ = reason;
      cancelled_ = cancelled;
    }
    cancel_.store(true);
    if (transport_ != nullptr) transport_->Abort(reason);
    if (rendezvous_ != nullptr) rendezvous_->Abort(reason);
  }

  // Lets the stage finish its current step, then end (RunStage sees the
  // flag before the next one) with `reason`; the transport is left alone so
  // the step's messages still flow. The first reason wins.
  void StopAfterStep(const absl::Status& reason) {
    absl::MutexLock lock(&mu_);
    if (reason_.ok()) {
      reason_ = reason;
      cancelled_ = false;
    }
    cancel_.store(true);
  }

  // Registers the transport to abort (null to unregister before it dies).
  void SetTransport(Transport* transport) {
    absl::MutexLock lock(&mu_);
    transport_ = transport;
    if (transport_ != nullptr && !reason_.ok()) transport_->Abort(reason_);
  }

  // Registers the rendezvous of a transport being created (null to
  // unregister before it dies), which receives the controller's replies.
  void SetRendezvous(RemoteRendezvous* rendezvous) {
    absl::MutexLock lock(&mu_);
    rendezvous_ = rendezvous;
    if (rendezvous_ != nullptr && !reason_.ok()) rendezvous_->Abort(reason_);
  }

  // Fails the pending and future requests of the rendezvous being used, if
  // any (the stream it goes over broke); the stage itself goes on.
  void FailRendezvous(const absl::Status& why) {
    absl::MutexLock lock(&mu_);
    if (rendezvous_ != nullptr) rendezvous_->Abort(why);
  }

  // Hands a RendezvousReply to the registered rendezvous; false when there
  // is none (a reply for a call that is over).
  bool DeliverRendezvousReply(const trainyard::v1::RendezvousReply& reply) {
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

  // The abort reason (OK if none) and whether it was a cancellation.
  std::pair<absl::Status, bool> abort_reason() const {
    absl::MutexLock lock(&mu_);
    return {reason_, cancelled_};
  }

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

void AddSpanProto(const Span& span, v1::StageTrace* out) {
  v1::StageSpan* s = out->add_spans();
  s->set_kind(span.kind);
  s->set_microbatch(span.microbatch);
  s->set_start_us(span.start_us);
  s->set_end_us(span.end_us);
}

WorkerMessage StepMessage(const std::string& job_id, int stage,
                          const StepReport& r, double step_seconds) {
  WorkerMessage m;
  auto* report = m.mutable_step();
  report->set_job_id(job_id);
  report->set_stage(stage);
  auto* step = report->mutable_step();
  step->set_step(r.step);
  step->set_loss(r.loss);
  step->set_lr(r.lr);
  step->set_grad_norm(r.grad_norm);
  step->set_samples_per_sec(step_seconds > 0 ? r.samples / step_seconds : 0);
  for (const auto& [name, value] : r.metrics) {
    (*step->mutable_metrics())[name] = value;
  }
  auto* timing = step->add_stages();
  timing->set_stage(stage);
  timing->set_forward_s(r.times.forward);
  timing->set_backward_s(r.times.backward);
  timing->set_comm_s(r.times.comm);
  timing->set_idle_s(r.times.idle);
  timing->set_optimizer_s(r.times.optimizer);
  timing->set_loss_s(r.times.loss);
  timing->set_h2d_copies(r.traffic.h2d_copies);
  timing->set_h2d_bytes(r.traffic.h2d_bytes);
  timing->set_d2h_copies(r.traffic.d2h_copies);
  timing->set_d2h_bytes(r.traffic.d2h_bytes);
  timing->set_syncs(r.traffic.syncs);
  v1::StageTrace* trace = report->mutable_trace();
  trace->set_stage(stage);
  trace->set_step_us(r.trace.step_us);
  trace->set_truncated(r.trace.truncated);
  for (const Span& span : r.trace.spans) AddSpanProto(span, trace);
  return m;
}

WorkerMessage EvalMessage(const std::string& job_id, int stage, int64_t step,
                          const EvalReport& r) {
  WorkerMessage m;
  auto* report = m.mutable_eval();
  report->set_job_id(job_id);
  report->set_stage(stage);
  auto* eval = report->mutable_eval();
  eval->set_step(step);
  eval->set_loss(r.loss);
  eval->set_samples(r.samples);
  for (const auto& [name, value] : r.metrics) {
    (*eval->mutable_metrics())[name] = value;
  }
  if (r.span.has_value()) {
    report->mutable_trace()->set_stage(stage);
    AddSpanProto(*r.span, report->mutable_trace());
  }
  return m;
}

WorkerMessage DoneMessage(const std::string& job_id, int stage,
                          const absl::Status& status, const std::string& error,
                          bool cancelled) {
  WorkerMessage m;
  auto* done = m.mutable_done();
  done->set_job_id(job_id);
  done->set_stage(stage);
  done->set_ok(status.ok());
  done->set_error(error);
  done->set_cancelled(cancelled);
  done->set_code(static_cast<int32_t>(status.code()));
  return m;
}

WorkerMessage StartedMessage(const std::string& job_id, int stage,
                             int64_t resume_step) {
  WorkerMessage m;
  auto* started = m.mutable_started();
  started->set_job_id(job_id);
  started->set_stage(stage);
  started->set_resume_step(resume_step);
  return m;
}

// One stage's Prometheus metrics (the worker's families, labelled with the
// stage), resolved once so that a step only adds numbers.
class StageMetrics {
 public:
  // A device stage's host<->device traffic: copies and bytes each way
  // ([0] to the device, [1] to the host) and synchronisations.
  struct DeviceCounters {
    std::array<prometheus::Counter*, 2> copies;
    std::array<prometheus::Counter*, 2> bytes;
    prometheus::Counter* syncs;
  };

  StageMetrics(prometheus::Counter& steps, prometheus::Histogram& step_seconds,
               std::array<prometheus::Counter*, 6> phases,
               prometheus::Gauge& bubble, prometheus::Counter& bytes_sent,
               prometheus::Counter& bytes_received, DeviceCounters device)
      : steps_(steps),
        step_seconds_(step_seconds),
        phases_(phases),
        bubble_(bubble),
        bytes_sent_(bytes_sent),
        bytes_received_(bytes_received),
        device_(device) {}

  // One step; `transport` (may be null) counts the bytes moved so far.
  void Record(const StepReport& r, double seconds, const Transport* transport) {
    steps_.Increment();
    step_seconds_.Observe(seconds);
    const double times[6] = {r.times.forward, r.times.backward,  r.times.comm,
                             r.times.idle,    r.times.optimizer, r.times.loss};
    for (int i = 0; i < 6; ++i) phases_[i]->Increment(times[i]);
    device_.copies[0]->Increment(static_cast<double>(r.traffic.h2d_copies));
    device_.copies[1]->Increment(static_cast<double>(r.traffic.d2h_copies));
    device_.bytes[0]->Increment(static_cast<double>(r.traffic.h2d_bytes));
    device_.bytes[1]->Increment(static_cast<double>(r.traffic.d2h_bytes));
    device_.syncs->Increment(static_cast<double>(r.traffic.syncs));
    bubble_.Set(seconds > 0 ? std::min(1.0, r.times.idle / seconds) : 0.0);
    if (transport != nullptr) {
      const int64_t sent = transport->payload_bytes_sent();
      const int64_t received = transport->payload_bytes_received();
      bytes_sent_.Increment(static_cast<double>(sent - sent_before_));
      bytes_received_.Increment(
          static_cast<double>(received - received_before_));
      sent_before_ = sent;
      received_before_ = received;
    }
  }

  // The phase label of phases[i].
  static constexpr const char* kPhases[6] = {"forward", "backward",  "comm",
                                             "idle",    "optimizer", "loss"};

 private:
  prometheus::Counter& steps_;
  prometheus::Histogram& step_seconds_;
  const std::array<prometheus::Counter*, 6> phases_;
  prometheus::Gauge& bubble_;
  prometheus::Counter& bytes_sent_;
  prometheus::Counter& bytes_received_;
  const DeviceCounters device_;
  int64_t sent_before_ = 0;
  int64_t received_before_ = 0;
};

// The most stage reports a worker keeps for resending after it reconnects
// (every report of its current job, normally): a controller away for
// longer than this many reports misses the oldest ones.
constexpr size_t kMaxKeptReports = 16384;

WorkerMessage TransportMessage(const std::string& job_id, int stage,
                               const TransportChoice& choice) {
  WorkerMessage m;
  auto* t = m.mutable_transport();
  t->set_job_id(job_id);
  t->set_stage(stage);
  t->set_kind(TransportKindName(choice.kind));
  t->set_reason(choice.reason);
  return m;
}

WorkerMessage RendezvousMessage(const std::string& job_id,
                                const RemoteRendezvous::Request& request) {
  WorkerMessage m;
  if (request.kind == RemoteRendezvous::Request::Kind::kPut) {
    auto* put = m.mutable_rendezvous_put();
    put->set_request_id(request.id);
    put->set_job_id(job_id);
    put->set_key(request.key);
    put->set_value(request.value);
  } else {
    auto* get = m.mutable_rendezvous_get();
    get->set_request_id(request.id);
    get->set_job_id(job_id);
    get->set_key(request.key);
    get->set_timeout_ms(absl::ToInt64Milliseconds(request.timeout));
  }
  return m;
}

// How long OnAssign waits for an aborted job to finish before refusing the
// next assignment: at least 15 s, and longer than a peer connect can take.
absl::Duration AbortedJobWait(absl::Duration peer_connect_timeout) {
  return std::max(absl::Seconds(15), peer_connect_timeout + absl::Seconds(5));
}

}  // namespace

absl::StatusOr<TransportChoice> ChooseAssignmentTransport(
    const v1::StageAssignment& assignment, int num_stages, bool nccl_built) {
  if (assignment.placements_size() == 0) {
    TransportChoice choice;
    choice.kind = TransportKind::kTcp;
    choice.reason =
        "the assignment names no stage placements (a controller older than "
        "this worker): using TCP";
    return choice;
  }
  if (assignment.placements_size() != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StageAssignment.placements: the job has ", num_stages, " stages, got ",
        assignment.placements_size(), " placements"));
  }
  std::vector<StagePlacement> stages;
  for (const v1::StagePlacement& p : assignment.placements()) {
    stages.push_back({p.host(), p.device()});
  }
  absl::StatusOr<TransportChoice> choice = ChooseTransport(stages, nccl_built);
  if (!choice.ok()) {
    return Prefixed(choice.status(), "StageAssignment.placements: ");
  }
  return choice;
}

absl::StatusOr<WorkerOptions> ValidateWorkerOptions(WorkerOptions options) {
  if (options.controller.empty()) {
    return absl::InvalidArgumentError(
        "--controller: required (host:port of the controller)");
  }
  if (options.device.empty()) options.device = "cpu";
  {
    absl::StatusOr<Device> device = ParseDevice(options.device);
    if (!device.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device: ", device.status().message()));
    }
    options.device = device->ToString();  // canonical: "cpu" or "cuda:N"
  }
  if (options.plugin_dir.empty()) {
    return absl::InvalidArgumentError("--plugin_dir: required");
  }
  if (!IsDirectory(options.plugin_dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--plugin_dir ", options.plugin_dir, ": not a directory"));
  }
  if (!options.data_dir.empty() && !IsDirectory(options.data_dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data_dir ", options.data_dir, ": not a directory"));
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads: must be >= 0, got ", options.threads));
  }
  {
    grpc::ChannelArguments unused;
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
        MakeChannelCredentials(options.tls, &unused);
    if (!creds.ok()) return creds.status();
  }
  if (options.connect_transport && options.peer_address.empty()) {
    return absl::InvalidArgumentError(
        "WorkerOptions.peer_address: required with connect_transport");
  }
  if (options.name.empty()) {
    options.name = absl::StrCat(Hostname(), "-", getpid());
  }
  if (options.memory_bytes == 0) options.memory_bytes = PhysicalMemoryBytes();
  if (options.min_backoff <= absl::ZeroDuration()) {
    options.min_backoff = absl::Milliseconds(10);
  }
  options.max_backoff = std::max(options.max_backoff, options.min_backoff);
  return options;
}

class Worker::Impl {
 public:
  // `options` are validated (ValidateWorkerOptions).
  explicit Impl(WorkerOptions options)
      : options_(std::move(options)), device_(*ParseDevice(options_.device)) {}
  ~Impl() { Shutdown(); }

  absl::Status Init();
  void Shutdown();
  void Drain(absl::Duration grace);

  std::string peer_address() const { return peer_address_; }
  int health_port() const { return health_port_; }
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  std::string worker_id() const {
    absl::MutexLock lock(&mu_);
    return worker_id_;
  }
  int64_t registrations() const {
    absl::MutexLock lock(&mu_);
    return registrations_;
  }
  bool busy() const {
    absl::MutexLock lock(&mu_);
    return job_ != nullptr && !job_finished_;
  }

 private:
  void ConnectionLoop();
  // Stops a running stage once the worker has been cut off from the
  // controller for longer than its adopt timeout (WorkerRegistered).
  void OrphanWatchdog();
  // Readiness: the health service's kRegisteredService status.
  void SetRegisteredHealth(bool registered);
  // One connect / register / serve cycle; true if the controller accepted
  // the registration.
  bool RunSession(int attempt);
  void HeartbeatLoop(Session* session);
  void OnRegistered(Session* session,
                    const trainyard::v1::WorkerRegistered& registered);
  void OnAssign(Session* session, const StageAssignment& assignment);
  void OnCancel(const CancelStage& cancel);
  void RunJob(StageAssignment assignment, std::shared_ptr<ActiveJob> job);
  absl::Status RunAssignment(const StageAssignment& assignment, ActiveJob* job);
  // A stage report (step, eval, transport, start, end): kept for resending
  // after a reconnect (without span traces), and written now when a
  // registered session is live.
  // Stages keep running while the controller is away.
  void Report(const WorkerMessage& message);
  // Writes to the live registered session; false when there is none.
  bool SendLive(const WorkerMessage& message);
  // Keeps a snapshot of `job_id` (the newest two steps per stage; another
  // job's are dropped) and tells the controller.
  void KeepSnapshot(const std::string& job_id, StageSnapshot snapshot);
  // The kept snapshot of `stage` after `step`, or an undefined tensor.
  Tensor HeldSnapshot(const std::string& job_id, int stage, int64_t step);
  // The transport of a multi-stage job: chosen from the placements,
  // reported, then connected (TCP) or created (NCCL).
  // `assignment` is this replica's pipeline (stage s of S); reports name
  // `report_rank` (the gang rank); the transport registers as
  // `transport_id` (the job id, or one per replica).
  absl::StatusOr<std::unique_ptr<Transport>> ConnectTransport(
      const StageAssignment& assignment, int num_stages, int report_rank,
      const std::string& transport_id, ActiveJob* job);
  // CreateNcclTransport (or the injected factory) with a rendezvous through
  // the controller on the live session (the job's store; keys under
  // `transport_id`).
  absl::StatusOr<std::unique_ptr<Transport>> CreateNccl(
      const std::string& job_id, const std::string& transport_id, int rank,
      int world_size, ActiveJob* job);
  void OnRendezvousReply(const trainyard::v1::RendezvousReply& reply);
  // Aborts the running stage (if any) and joins its thread.
  void StopJob(const absl::Status& reason);

  WorkerOptions options_;
  const Device device_;
  // Sends the lines logged about a running job (engine/job_log.h).
  std::unique_ptr<JobLogForwarder> job_log_;
  std::string peer_address_;
  std::unique_ptr<PeerListener> listener_;
  TransportFactory connect_transport_;
  NcclTransportFactory create_nccl_transport_;
  std::unique_ptr<grpc::Server> health_server_;
  int health_port_ = 0;

  // Prometheus metrics (null without --metrics_listen); the families are
  // owned by the endpoint's registry.
  std::unique_ptr<MetricsEndpoint> metrics_;
  prometheus::Family<prometheus::Counter>* steps_ = nullptr;
  prometheus::Family<prometheus::Histogram>* step_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* phase_seconds_ = nullptr;
  prometheus::Family<prometheus::Gauge>* bubble_ = nullptr;
  prometheus::Histogram* checkpoint_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* snapshots_kept_ = nullptr;
  prometheus::Family<prometheus::Counter>* payload_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* device_copies_ = nullptr;
  prometheus::Family<prometheus::Counter>* device_copy_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* device_syncs_ = nullptr;
  // The metrics of stage `stage`, looked up once per assignment; null
  // without --metrics_listen.
  std::unique_ptr<StageMetrics> MetricsOfStage(int stage);

  absl::Notification shutdown_;
  std::thread connection_thread_;
  std::once_flag shutdown_once_;

  mutable absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  Session* session_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  int64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<ActiveJob> job_ ABSL_GUARDED_BY(mu_);
  bool job_finished_ ABSL_GUARDED_BY(mu_) = true;
  // Its StageDone has been handed to the stream (Drain waits for it).
  bool job_reported_ ABSL_GUARDED_BY(mu_) = false;
  // Drain was called: no new stage, no reconnect.
  std::atomic<bool> draining_{false};
  std::thread job_thread_ ABSL_GUARDED_BY(mu_);

  // Reports of the current job, oldest first (Report), and the registered
  // session they go to now (null while disconnected). Lock order: mu_
  // before report_mu_.
  absl::Mutex report_mu_;
  std::deque<WorkerMessage> reports_ ABSL_GUARDED_BY(report_mu_);

  // In-memory snapshots (JobSpec.recovery.snapshot_every) of one job's
  // stages, this worker's and its neighbours': stage -> step -> bytes. They
  // outlive the stage, so a restart can resume from them.
  absl::Mutex snapshot_mu_;
  std::string snapshot_job_ ABSL_GUARDED_BY(snapshot_mu_);
  std::map<int, std::map<int64_t, Tensor>> snapshots_
      ABSL_GUARDED_BY(snapshot_mu_);
  bool reports_dropped_ ABSL_GUARDED_BY(report_mu_) = false;
  Session* live_ ABSL_GUARDED_BY(report_mu_) = nullptr;
  absl::Time disconnected_since_ ABSL_GUARDED_BY(report_mu_) =
      absl::InfiniteFuture();
  absl::Duration adopt_timeout_ ABSL_GUARDED_BY(report_mu_) =
      absl::ZeroDuration();
  std::thread watchdog_thread_;
};

absl::Status Worker::Impl::Init() {
  if (device_.is_cuda() && options_.check_device) {
    // Fail at start, not at the first assignment, when the GPU is unusable.
    absl::StatusOr<std::unique_ptr<ExecContext>> probe =
        ExecContext::Create(device_, Precision::kFp32);
    if (!probe.ok()) {
      return Prefixed(probe.status(),
                      absl::StrCat("--device ", device_.ToString(), ": "));
    }
  }
  if (options_.threads > 0) SetBlasThreads(options_.threads);
  {
    JobLogOptions log_options;
    log_options.drop_prefix =
        absl::StrCat("trainyard-worker ", options_.name, ": ");
    job_log_ = std::make_unique<JobLogForwarder>(
        [this](const WorkerMessage& m) { return SendLive(m); },
        std::move(log_options));
  }
  if (options_.create_nccl_transport) {
    create_nccl_transport_ = options_.create_nccl_transport;
  } else {
    create_nccl_transport_ = [](const NcclTransportOptions& nccl)
        -> absl::StatusOr<std::unique_ptr<Transport>> {
      ASSIGN_OR_RETURN(std::unique_ptr<NcclTransport> transport,
                       CreateNcclTransport(nccl));
      // The stage's kernels run on its GPU's compute stream (one per GPU
      // and process, kernels/exec_context.h): the transport orders its own
      // streams against that one.
      ASSIGN_OR_RETURN(
          std::unique_ptr<ExecContext> gpu,
          ExecContext::Create(Device::Cuda(nccl.device), Precision::kFp32));
      transport->SetComputeStream(gpu->stream());
      return std::unique_ptr<Transport>(std::move(transport));
    };
  }
  if (options_.connect_transport) {
    connect_transport_ = options_.connect_transport;
    peer_address_ = options_.peer_address;
  } else {
    absl::StatusOr<std::unique_ptr<PeerListener>> listener =
        PeerListener::Listen(options_.listen);
    if (!listener.ok()) return Prefixed(listener.status(), "--listen: ");
    listener_ = std::move(*listener);
    peer_address_ = options_.advertise_address.empty()
                        ? listener_->address()
                        : options_.advertise_address;
    PeerListener* raw = listener_.get();
    const absl::Duration connect_timeout = options_.peer_connect_timeout;
    connect_transport_ = [raw, connect_timeout](
                             const std::string& job_id, int rank,
                             const std::vector<std::string>& peers,
                             const std::string& secret,
                             const std::atomic<bool>* cancel) {
      TcpTransportOptions tcp;
      tcp.job_id = job_id;
      tcp.rank = rank;
      tcp.peer_addresses = peers;
      tcp.secret = secret;
      tcp.connect_timeout = connect_timeout;
      tcp.cancel = cancel;
      return ConnectTcpTransport(raw, tcp);
    };
  }

  if (!options_.metrics_listen.empty()) {
    ASSIGN_OR_RETURN(metrics_, MetricsEndpoint::Start(options_.metrics_listen));
    prometheus::Registry& r = metrics_->registry();
    steps_ = &prometheus::BuildCounter()
                  .Name("trainyard_worker_steps_total")
                  .Help("Steps this worker's stages completed.")
                  .Register(r);
    step_seconds_ = &prometheus::BuildHistogram()
                         .Name("trainyard_worker_step_seconds")
                         .Help("Wall time of one step of this worker's stage.")
                         .Register(r);
    phase_seconds_ =
        &prometheus::BuildCounter()
             .Name("trainyard_worker_phase_seconds_total")
             .Help(
                 "Seconds spent per phase of the steps (forward, backward, "
                 "comm, idle = waiting for a neighbour, optimizer, loss); "
                 "device time on a GPU.")
             .Register(r);
    device_copies_ =
        &prometheus::BuildCounter()
             .Name("trainyard_worker_device_copies_total")
             .Help(
                 "Copies between host and device made by this worker's "
                 "stages (direction to_device or to_host); 0 on the CPU.")
             .Register(r);
    device_copy_bytes_ = &prometheus::BuildCounter()
                              .Name("trainyard_worker_device_copy_bytes_total")
                              .Help("Bytes of those copies, by direction.")
                              .Register(r);
    device_syncs_ =
        &prometheus::BuildCounter()
             .Name("trainyard_worker_device_syncs_total")
             .Help(
                 "Times this worker's stages waited for their device inside "
                 "steps (one per step on a GPU job that keeps its step on "
                 "the device).")
             .Register(r);
    bubble_ = &prometheus::BuildGauge()
                   .Name("trainyard_worker_bubble_fraction")
                   .Help(
                       "Idle share of the last step's wall time (the "
                       "pipeline bubble as measured).")
                   .Register(r);
    checkpoint_seconds_ =
        &prometheus::BuildHistogram()
             .Name("trainyard_worker_checkpoint_write_seconds")
             .Help(
                 "Seconds to write one stage's checkpoint file (in the "
                 "background).")
             .Register(r)
             .Add({}, prometheus::Histogram::BucketBoundaries{
                          0.001, 0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60});
    payload_bytes_ =
        &prometheus::BuildCounter()
             .Name("trainyard_worker_payload_bytes_total")
             .Help(
                 "Tensor bytes this worker's stages sent to and received "
                 "from their neighbours over TCP (NCCL traffic is not "
                 "counted).")
             .Register(r);
    snapshots_kept_ = &prometheus::BuildCounter()
                           .Name("trainyard_worker_snapshots_total")
                           .Help(
                               "In-memory snapshots kept (own stage's, or a "
                               "neighbour's copy).")
                           .Register(r);
    metrics_->AddCollector([this] {
      LabeledValues busy;
      busy.push_back({{}, this->busy() ? 1.0 : 0.0});
      std::vector<prometheus::MetricFamily> out;
      out.push_back(GaugeFamily("trainyard_worker_busy",
                                "1 while this worker runs a stage.", busy));
      if (device_.is_cuda()) {
        absl::StatusOr<gpu::DeviceAllocator*> allocator =
            gpu::DeviceAllocator::ForDevice(device_.index);
        if (allocator.ok()) {
          const gpu::AllocatorStats st = (*allocator)->stats();
          out.push_back(GaugeFamily(
              "trainyard_worker_device_memory_bytes",
              "GPU memory of this worker's caching allocator: in_use (live "
              "blocks), cached (free blocks kept), peak (most in use).",
              {{{{"kind", "in_use"}}, static_cast<double>(st.bytes_in_use)},
               {{{"kind", "cached"}}, static_cast<double>(st.bytes_cached)},
               {{{"kind", "peak"}},
                static_cast<double>(st.peak_bytes_in_use)}}));
        }
      }
      return out;
    });
  }

  if (!options_.health_listen.empty()) {
    static std::once_flag once;
    std::call_once(once, [] {
      grpc::EnableDefaultHealthCheckService(true);
      grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    });
    TlsOptions health_tls = options_.tls;
    health_tls.ca_file.clear();  // probes need no client certificate
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> health_creds,
                     MakeServerCredentials(health_tls));
    grpc::ServerBuilder builder;
    builder.AddListeningPort(options_.health_listen, health_creds,
                             &health_port_);
    health_server_ = builder.BuildAndStart();
    if (health_server_ == nullptr || health_port_ == 0) {
      health_server_.reset();
      return absl::UnavailableError(absl::StrCat(
          "--health_listen ", options_.health_listen, ": cannot listen"));
    }
    // "" (liveness): the process serves. kRegisteredService (readiness):
    // registered with the controller right now.
    health_server_->GetHealthCheckService()->SetServingStatus(true);
    health_server_->GetHealthCheckService()->SetServingStatus(
        kRegisteredService, false);
  }

  LOG(INFO) << "trainyard-worker " << options_.name << ": peers dial "
            << peer_address_ << ", health port " << health_port_
            << ", plugins in " << options_.plugin_dir << ", controller "
            << options_.controller;
  connection_thread_ = std::thread([this] { ConnectionLoop(); });
  watchdog_thread_ = std::thread([this] { OrphanWatchdog(); });
  return absl::OkStatus();
}

void Worker::Impl::Drain(absl::Duration grace) {
  // No new stage from now on: refused here, and the controller is told.
  draining_.store(true);
  {
    WorkerMessage beat;
    beat.mutable_heartbeat()->set_time_ms(absl::ToUnixMillis(absl::Now()));
    beat.mutable_heartbeat()->set_draining(true);
    absl::MutexLock lock(&report_mu_);
    if (live_ != nullptr) live_->Write(beat);
  }
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
  absl::MutexLock lock(&report_mu_);
  Session* const session = live_;
  if (session == nullptr) return;
  {
    absl::MutexLock wlock(&session->write_mu);
    session->stream->WritesDone();
  }
  auto ended = [this, session]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(report_mu_) {
    return live_ != session;
  };
  report_mu_.AwaitWithDeadline(absl::Condition(&ended), deadline);
}

void Worker::Impl::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    {
      absl::MutexLock lock(&mu_);
      shutting_down_ = true;
      if (session_ != nullptr) session_->context.TryCancel();
    }
    shutdown_.Notify();
    if (connection_thread_.joinable()) connection_thread_.join();
    if (watchdog_thread_.joinable()) watchdog_thread_.join();
    // No session runs now, but a job may have started and ended without one.
    StopJob(absl::CancelledError("worker shutting down"));
    if (health_server_ != nullptr) {
      health_server_->Shutdown(std::chrono::system_clock::now());
      health_server_->Wait();
    }
    // Its collector reads this object: stop it before the members go.
    metrics_.reset();
  });
}

void Worker::Impl::SetRegisteredHealth(bool registered) {
  if (health_server_ != nullptr) {
    health_server_->GetHealthCheckService()->SetServingStatus(
        kRegisteredService, registered);
  }
}

void Worker::Impl::ConnectionLoop() {
  absl::Duration backoff = options_.min_backoff;
  int attempt = 0;
  while (!shutdown_.HasBeenNotified()) {
    ++attempt;
    const bool registered = RunSession(attempt);
    SetRegisteredHealth(false);
    if (shutdown_.HasBeenNotified() || draining_.load()) break;
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

bool Worker::Impl::RunSession(int attempt) {
  auto session = std::make_unique<Session>();
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return false;
    session_ = session.get();
  }
  LOG(INFO) << "trainyard-worker " << options_.name << ": connecting to "
            << options_.controller << " (attempt " << attempt << ")";
  // HTTP/2 keepalive pings: a controller that vanished or froze without
  // closing the connection breaks the stream within ~15 s (blocked report
  // writes fail, the stage is aborted, the worker reconnects) instead of
  // after the kernel's TCP timeouts.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // The files were checked by ValidateWorkerOptions; a failure here (a file
  // changed since) ends this attempt, and the loop retries.
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      MakeChannelCredentials(options_.tls, &args);
  if (!creds.ok()) {
    LOG(ERROR) << "trainyard-worker " << options_.name << ": "
               << creds.status().message();
    absl::MutexLock lock(&mu_);
    session_ = nullptr;
    return false;
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options_.controller, *creds, args);
  std::unique_ptr<WorkerService::Stub> stub = WorkerService::NewStub(channel);
  session->stream = stub->Connect(&session->context);
  // Also the registration watchdog: it cancels the stream if the controller
  // does not answer in time, which ends the Read loop below.
  std::thread heartbeat([this, s = session.get()] { HeartbeatLoop(s); });

  WorkerMessage hello;
  auto* reg = hello.mutable_register_();
  reg->set_name(options_.name);
  auto* caps = reg->mutable_capabilities();
  caps->set_device(options_.device);
  caps->set_memory_bytes(options_.memory_bytes);
  caps->set_peer_address(peer_address_);
  caps->set_threads(
      options_.threads > 0
          ? options_.threads
          : static_cast<int>(std::thread::hardware_concurrency()));
  caps->set_hostname(Hostname());
  {
    // A reconnecting worker keeps its id and claims the stage it still runs
    // (or ran, with reports to resend): a restarted controller re-adopts it.
    absl::MutexLock lock(&mu_);
    reg->set_worker_id(worker_id_);
    bool unsent;
    {
      absl::MutexLock rlock(&report_mu_);
      unsent = !reports_.empty();
    }
    if (job_ != nullptr && (!job_finished_ || unsent)) {
      auto* claim = reg->mutable_running();
      claim->set_job_id(job_->job_id());
      claim->set_stage(job_->stage());
      claim->set_attempt(job_->attempt());
    }
  }
  session->Write(hello);  // a failure shows up as the end of the stream

  ControllerMessage message;
  bool registered = false;
  while (session->stream->Read(&message)) {
    if (message.has_registered()) {
      OnRegistered(session.get(), message.registered());
      registered = true;
    } else if (!registered) {
      LOG(ERROR) << "trainyard-worker: controller " << options_.controller
                 << " sent " << message.msg_case()
                 << " before WorkerRegistered; reconnecting";
      session->context.TryCancel();
    } else if (message.has_assign()) {
      OnAssign(session.get(), message.assign());
    } else if (message.has_cancel()) {
      OnCancel(message.cancel());
    } else if (message.has_rendezvous_reply()) {
      OnRendezvousReply(message.rendezvous_reply());
    } else {
      LOG(WARNING) << "trainyard-worker: ignoring an unknown controller "
                      "message (field "
                   << message.msg_case() << ")";
    }
  }
  {
    absl::MutexLock lock(&session->mu);
    session->done = true;
    session->cv.SignalAll();
  }
  {
    // A running stage goes on: its reports are kept until the next
    // registration (a controller restart loses nothing).
    absl::MutexLock lock(&report_mu_);
    if (live_ == session.get()) {
      live_ = nullptr;
      disconnected_since_ = absl::Now();
    }
  }
  {
    // A rendezvous needs the controller: one waiting on this stream fails
    // now instead of waiting out its timeout.
    absl::MutexLock lock(&mu_);
    if (job_ != nullptr && !job_finished_) {
      job_->FailRendezvous(absl::UnavailableError(absl::StrCat(
          "worker ", options_.name,
          " lost its connection to the controller at ", options_.controller)));
    }
  }
  heartbeat.join();
  const grpc::Status status = session->stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    session_ = nullptr;
  }
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

void Worker::Impl::OrphanWatchdog() {
  while (!shutdown_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    absl::Duration away;
    absl::Duration limit;
    {
      absl::MutexLock lock(&report_mu_);
      if (live_ != nullptr || adopt_timeout_ <= absl::ZeroDuration()) continue;
      away = absl::Now() - disconnected_since_;
      limit = adopt_timeout_;
    }
    if (away <= limit) continue;
    absl::MutexLock lock(&mu_);
    if (job_ == nullptr || job_finished_ || !job_->abort_reason().first.ok()) {
      continue;
    }
    ScopedJobLog scope(job_log_.get(), job_->job_id(), job_->stage());
    LOG(WARNING) << "trainyard-worker " << options_.name
                 << ": no controller for " << absl::FormatDuration(away)
                 << "; stopping job " << job_->job_id() << " stage "
                 << job_->stage();
    job_->Abort(absl::UnavailableError(absl::StrCat(
                    "worker ", options_.name,
                    " was cut off from the "
                    "controller for more than ",
                    absl::FormatDuration(limit),
                    ": its stage may have been given to another worker")),
                /*cancelled=*/false);
  }
}

void Worker::Impl::HeartbeatLoop(Session* session) {
  int64_t interval_ms;
  {
    absl::MutexLock lock(&session->mu);
    const absl::Time deadline = absl::Now() + options_.register_timeout;
    while (!session->registered && !session->done) {
      if (session->cv.WaitWithDeadline(&session->mu, deadline)) break;
    }
    if (session->done) return;
    if (!session->registered) {
      LOG(WARNING) << "trainyard-worker " << options_.name
                   << ": no WorkerRegistered from " << options_.controller
                   << " within "
                   << absl::FormatDuration(options_.register_timeout);
      session->context.TryCancel();
      return;
    }
    interval_ms = session->heartbeat_interval_ms;
  }
  while (true) {
    {
      absl::MutexLock lock(&session->mu);
      const absl::Time deadline = absl::Now() + absl::Milliseconds(interval_ms);
      while (!session->done) {
        if (session->cv.WaitWithDeadline(&session->mu, deadline)) break;
      }
      if (session->done) return;
      interval_ms = session->heartbeat_interval_ms;
    }
    WorkerMessage beat;
    beat.mutable_heartbeat()->set_time_ms(absl::ToUnixMillis(absl::Now()));
    if (!session->Write(beat)) {
      session->context.TryCancel();
      return;
    }
  }
}

void Worker::Impl::OnRegistered(
    Session* session, const trainyard::v1::WorkerRegistered& registered) {
  {
    absl::MutexLock lock(&session->mu);
    session->registered = true;
    if (registered.heartbeat_interval_ms() > 0) {
      session->heartbeat_interval_ms = registered.heartbeat_interval_ms();
    }
    session->cv.SignalAll();
  }
  SetRegisteredHealth(true);
  {
    // Resend every kept report, in order, before any new one: what the old
    // controller had already published is dropped by the new one.
    absl::MutexLock lock(&report_mu_);
    live_ = session;
    disconnected_since_ = absl::InfiniteFuture();
    adopt_timeout_ = absl::Milliseconds(registered.adopt_timeout_ms());
    for (const WorkerMessage& m : reports_) {
      if (!session->Write(m)) break;  // the reader sees the stream end
    }
  }
  absl::MutexLock lock(&mu_);
  worker_id_ = registered.worker_id();
  ++registrations_;
  LOG(INFO) << "trainyard-worker " << options_.name << ": registered as "
            << worker_id_ << " with " << options_.controller
            << ", heartbeat every " << registered.heartbeat_interval_ms()
            << " ms";
}

void Worker::Impl::OnAssign(Session* session,
                            const StageAssignment& assignment) {
  std::thread finished;
  std::string busy_with;
  {
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
    if (draining_.load()) {
      busy_with = "(shutting down)";
    } else if (job_ != nullptr && !job_finished_) {
      busy_with = job_->job_id();
    } else {
      finished = std::move(job_thread_);
      auto job = std::make_shared<ActiveJob>(
          assignment.job_id(), assignment.stage(), assignment.attempt());
      job_ = job;
      job_finished_ = false;
      job_reported_ = false;
      {
        // The previous job's reports were resent at registration.
        absl::MutexLock rlock(&report_mu_);
        reports_.clear();
        reports_dropped_ = false;
      }
      job_thread_ =
          std::thread([this, assignment, job] { RunJob(assignment, job); });
    }
  }
  // The finished job has reported already; its thread is exiting.
  if (finished.joinable()) finished.join();
  if (!busy_with.empty()) {
    ScopedJobLog scope(job_log_.get(), assignment.job_id(), assignment.stage());
    const absl::Status busy = absl::UnavailableError(
        draining_.load()
            ? absl::StrCat("worker ", options_.name, " is shutting down")
            : absl::StrCat("worker ", options_.name, " busy with job ",
                           busy_with));
    LOG(WARNING) << "trainyard-worker " << options_.name << ": refusing job "
                 << assignment.job_id() << ": " << busy.message();
    session->Write(DoneMessage(assignment.job_id(), assignment.stage(), busy,
                               std::string(busy.message()), false));
  }
}

void Worker::Impl::OnCancel(const CancelStage& cancel) {
  absl::MutexLock lock(&mu_);
  if (job_ != nullptr && job_finished_ && job_->job_id() == cancel.job_id()) {
    // The controller refused our claim on a stage that has ended: the
    // kept reports are of no use to it, and need not be claimed again.
    absl::MutexLock rlock(&report_mu_);
    reports_.clear();
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

void Worker::Impl::OnRendezvousReply(
    const trainyard::v1::RendezvousReply& reply) {
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
  absl::Status status = RunAssignment(assignment, job.get());
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
  Report(
      DoneMessage(job->job_id(), job->stage(), status, error, was_cancelled));
  absl::MutexLock lock(&mu_);
  job_reported_ = true;
}

std::unique_ptr<StageMetrics> Worker::Impl::MetricsOfStage(int stage) {
  if (metrics_ == nullptr) return nullptr;
  const std::string k = absl::StrCat(stage);
  std::array<prometheus::Counter*, 6> phases;
  for (int i = 0; i < 6; ++i) {
    phases[i] = &phase_seconds_->Add(
        {{"stage", k}, {"phase", StageMetrics::kPhases[i]}});
  }
  StageMetrics::DeviceCounters device;
  const char* directions[2] = {"to_device", "to_host"};
  for (int i = 0; i < 2; ++i) {
    device.copies[i] =
        &device_copies_->Add({{"stage", k}, {"direction", directions[i]}});
    device.bytes[i] =
        &device_copy_bytes_->Add({{"stage", k}, {"direction", directions[i]}});
  }
  device.syncs = &device_syncs_->Add({{"stage", k}});
  return std::make_unique<StageMetrics>(
      steps_->Add({{"stage", k}}),
      step_seconds_->Add({{"stage", k}},
                         prometheus::Histogram::BucketBoundaries{
                             0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2,
                             0.5, 1, 2, 5, 10, 30}),
      phases, bubble_->Add({{"stage", k}}),
      payload_bytes_->Add({{"stage", k}, {"direction", "sent"}}),
      payload_bytes_->Add({{"stage", k}, {"direction", "received"}}), device);
}

void Worker::Impl::Report(const WorkerMessage& message) {
  absl::MutexLock lock(&report_mu_);
  if (live_ != nullptr) live_->Write(message);
  // Kept without its span trace: a job's reports are kept for its whole
  // run, and traces are what a live controller shows, not history.
  reports_.push_back(message);
  if (reports_.back().has_step()) {
    reports_.back().mutable_step()->clear_trace();
  } else if (reports_.back().has_eval()) {
    reports_.back().mutable_eval()->clear_trace();
  }
  if (reports_.size() > kMaxKeptReports) {
    reports_.pop_front();
    if (!reports_dropped_) {
      reports_dropped_ = true;
      LOG(WARNING) << "trainyard-worker " << options_.name << ": more than "
                   << kMaxKeptReports
                   << " reports kept for the controller; dropping the "
                      "oldest";
    }
  }
}

void Worker::Impl::KeepSnapshot(const std::string& job_id,
                                StageSnapshot snapshot) {
  {
    absl::MutexLock lock(&snapshot_mu_);
    if (snapshot_job_ != job_id) {
      snapshots_.clear();
      snapshot_job_ = job_id;
    }
    auto& steps = snapshots_[snapshot.stage];
    // A snapshot older than those held means the job restarted from an
    // earlier step: the later ones belong to the abandoned run (the
    // controller forgets them too) and would push out the new run's.
    steps.erase(steps.upper_bound(snapshot.step), steps.end());
    if (steps.empty()) {
      LOG(INFO) << "trainyard-worker " << options_.name << ": keeping "
                << "in-memory snapshots of job " << job_id << " stage "
                << snapshot.stage << " (" << snapshot.bytes.nbytes()
                << " bytes each, the newest two steps)";
    }
    steps[snapshot.step] = std::move(snapshot.bytes);
    while (steps.size() > 2) steps.erase(steps.begin());
  }
  WorkerMessage m;
  m.mutable_held()->set_job_id(job_id);
  m.mutable_held()->set_stage(snapshot.stage);
  m.mutable_held()->set_step(snapshot.step);
  Report(m);
}

Tensor Worker::Impl::HeldSnapshot(const std::string& job_id, int stage,
                                  int64_t step) {
  absl::MutexLock lock(&snapshot_mu_);
  if (snapshot_job_ != job_id) return Tensor();
  auto it = snapshots_.find(stage);
  if (it == snapshots_.end()) return Tensor();
  auto s = it->second.find(step);
  return s == it->second.end() ? Tensor() : s->second;
}

bool Worker::Impl::SendLive(const WorkerMessage& message) {
  absl::MutexLock lock(&report_mu_);
  return live_ != nullptr && live_->Write(message);
}

absl::Status Worker::Impl::RunAssignment(const StageAssignment& assignment,
                                         ActiveJob* job) {
  if (assignment.job_id().empty()) {
    return absl::InvalidArgumentError("StageAssignment.job_id: empty");
  }
  PlanOptions plan_options;
  plan_options.base_dir = options_.data_dir;
  // With a --data_dir, a spec's paths must stay inside it.
  plan_options.confine_to = options_.data_dir;
  plan_options.memory_limit_bytes = options_.memory_bytes;
  plan_options.check_files = true;
  absl::StatusOr<JobPlan> plan = PlanJob(assignment.spec(), plan_options);
  if (!plan.ok()) return Prefixed(plan.status(), "invalid job spec: ");
  const int num_stages = plan->num_stages();
  // With replicas the assignment's stage is the gang rank r * S + s: this
  // worker runs stage s of replica r, whose pipeline is ranks
  // [r S, (r + 1) S) (their addresses and placements).
  const Gang gang = plan->gang();
  const int replicas = gang.replicas;
  const int rank = assignment.stage();
  if (rank < 0 || rank >= gang.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageAssignment.stage: must be in [0, ",
                     gang.size(), ") for this job, got ", rank));
  }
  const int s = gang.StageOf(rank);
  const int replica = gang.ReplicaOf(rank);
  if (replicas > 1 && assignment.snapshot().step() > 0) {
    return absl::InvalidArgumentError(
        "StageAssignment.snapshot: a job with replicas resumes from "
        "checkpoints only");
  }
  StageAssignment pipeline = assignment;  // this replica's ranks
  if (replicas > 1) {
    if (assignment.peer_addresses_size() != gang.size() ||
        (assignment.placements_size() > 0 &&
         assignment.placements_size() != gang.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("StageAssignment: a job of ", num_stages, " stages x ",
                       replicas, " replicas needs ", gang.size(),
                       " peer addresses and placements"));
    }
    pipeline.set_stage(s);
    pipeline.clear_peer_addresses();
    pipeline.clear_placements();
    for (int k = gang.RankOf(replica, 0); k < gang.RankOf(replica + 1, 0);
         ++k) {
      pipeline.add_peer_addresses(assignment.peer_addresses(k));
      if (assignment.placements_size() > 0) {
        *pipeline.add_placements() = assignment.placements(k);
      }
    }
  }
  // Each replica's pipeline is its own transport, so its connections are
  // registered under their own id.
  const std::string transport_id =
      replicas > 1 ? absl::StrCat(assignment.job_id(), "/replica-", replica)
                   : assignment.job_id();

  std::unique_ptr<Transport> transport;
  if (num_stages > 1) {
    ASSIGN_OR_RETURN(transport, ConnectTransport(pipeline, num_stages, rank,
                                                 transport_id, job));
    job->SetTransport(transport.get());
  }

  const std::string& job_id = assignment.job_id();
  // The copies of this stage in every replica sum their gradients over
  // Gloo; they find each other through the job's rendezvous store at the
  // controller.
  std::unique_ptr<RemoteRendezvous> replica_rendezvous;
  std::unique_ptr<ReplicaGroup> replica_group;
  if (replicas > 1) {
    replica_rendezvous = std::make_unique<RemoteRendezvous>(
        absl::StrCat("controller ", options_.controller),
        [this, job_id](const RemoteRendezvous::Request& request) {
          return SendLive(RendezvousMessage(job_id, request));
        });
    job->SetRendezvous(replica_rendezvous.get());
    ReplicaGroupOptions group;
    group.rank = replica;
    group.size = replicas;
    group.key_prefix =
        absl::StrCat(job_id, "/attempt-", assignment.attempt(), "/stage-", s);
    group.hostname = HostOfAddress(peer_address_);
    group.timeout =
        std::min(options_.stage_timeout, options_.peer_connect_timeout);
    absl::StatusOr<std::unique_ptr<ReplicaGroup>> joined =
        ReplicaGroup::Join(replica_rendezvous.get(), group);
    job->SetRendezvous(nullptr);
    if (!joined.ok()) {
      if (transport != nullptr) transport->Abort(joined.status());
      job->SetTransport(nullptr);
      return Prefixed(joined.status(), "joining the other replicas: ");
    }
    replica_group = *std::move(joined);
  }
  {
    // Snapshots of another job are of no use any more.
    absl::MutexLock lock(&snapshot_mu_);
    if (snapshot_job_ != job_id) {
      snapshots_.clear();
      snapshot_job_ = job_id;
    }
  }
  absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const Precision precision,
                     PrecisionFromName(plan->spec.precision()));
    ASSIGN_OR_RETURN(std::unique_ptr<ExecContext> exec,
                     ExecContext::Create(device_, precision));
    StageOptions stage_options;
    stage_options.plugin_dir = options_.plugin_dir;
    stage_options.data_dir = options_.data_dir;
    stage_options.timeout = options_.stage_timeout;
    stage_options.exec = exec.get();
    stage_options.replica = replica;
    stage_options.replica_group = replica_group.get();
    std::optional<StageSnapshot> snapshot;
    if (assignment.snapshot().step() > 0) {
      const SnapshotResume& from = assignment.snapshot();
      if (from.source_ranks_size() != num_stages) {
        return absl::InvalidArgumentError(absl::StrCat(
            "StageAssignment.snapshot.source_ranks: the job has ", num_stages,
            " stages, got ", from.source_ranks_size()));
      }
      for (int src : from.source_ranks()) {
        if (src < 0 || src >= num_stages) {
          return absl::InvalidArgumentError(
              absl::StrCat("StageAssignment.snapshot.source_ranks: rank ", src,
                           " is not in [0, ", num_stages, ")"));
        }
      }
      ASSIGN_OR_RETURN(snapshot,
                       DistributeSnapshots(
                           transport.get(), s, from.step(),
                           std::vector<int>(from.source_ranks().begin(),
                                            from.source_ranks().end()),
                           [&](int stage) {
                             return HeldSnapshot(job_id, stage, from.step());
                           },
                           options_.stage_timeout));
    }
    ASSIGN_OR_RETURN(StartedStage started,
                     StartStage(*plan, s, transport.get(), stage_options,
                                snapshot ? &*snapshot : nullptr,
                                assignment.has_max_resume_step()
                                    ? assignment.max_resume_step()
                                    : -1));
    std::unique_ptr<Stage> stage = std::move(started.stage);
    if (started.resume_step > 0) {
      LOG(INFO) << "trainyard-worker " << options_.name << ": job " << job_id
                << " stage " << s << " resumed at step " << started.resume_step;
    }
    Report(StartedMessage(job_id, rank, started.resume_step));
    StageRunOptions run;
    run.timeout = options_.stage_timeout;
    run.cancel = job->cancel_flag();
    run.snapshot_every = plan->spec.recovery().snapshot_every();
    // Replicas hold the same state: the first writes the checkpoints.
    run.write_checkpoints = replica == 0;
    run.may_commit = [this] {
      absl::MutexLock lock(&report_mu_);
      return live_ != nullptr;
    };
    run.on_snapshot = [&](StageSnapshot snap) {
      if (snapshots_kept_ != nullptr) {
        snapshots_kept_->Add({{"kind", snap.stage == s ? "own" : "copy"}})
            .Increment();
      }
      KeepSnapshot(job_id, std::move(snap));
    };
    if (checkpoint_seconds_ != nullptr) {
      run.on_checkpoint_file = [this](double seconds) {
        checkpoint_seconds_->Observe(seconds);
      };
    }
    if (rank == 0) {
      // The controller weighs committed checkpoints against snapshots.
      run.on_checkpoint = [&](int64_t step, const std::string& dir) {
        {
          // On the checkpoint writer's thread.
          ScopedJobLog scope(job_log_.get(), job_id, s);
          LOG(INFO) << "trainyard-worker " << options_.name << ": job "
                    << job_id << " checkpoint step " << step << " saved in "
                    << dir;
        }
        WorkerMessage m;
        m.mutable_held()->set_job_id(job_id);
        m.mutable_held()->set_stage(-1);
        m.mutable_held()->set_step(step);
        Report(m);
      };
    }
    std::unique_ptr<StageMetrics> metrics = MetricsOfStage(s);
    run.on_step = [&](const StepReport& report, double seconds) {
      if (metrics != nullptr) metrics->Record(report, seconds, transport.get());
      Report(StepMessage(job_id, rank, report, seconds));
    };
    // Every stage reports its evals (the pass is a span of its trace); the
    // controller publishes the last stage's metrics.
    run.on_eval = [&](int64_t step, const EvalReport& report) {
      Report(EvalMessage(job_id, rank, step, report));
    };
    return RunStage(*stage, transport.get(), *plan, run);
  }();
  if (!status.ok() && transport != nullptr) {
    // Stopped by this worker itself (draining, cut off): the peers hear that
    // cause, not the stage's own "cancelled".
    absl::Status cause = status;
    if (const auto [reason, cancelled] = job->abort_reason();
        !reason.ok() && !cancelled) {
      cause = reason;
    }
    transport->Abort(absl::Status(
        cause.code(), absl::StrCat("stage ", s, " failed: ", cause.message())));
  }
  job->SetTransport(nullptr);
  // The stage is gone: give its cached host blocks back (the next job may
  // have other shapes).
  HostAllocator()->EmptyCache();
  return status;
}

absl::StatusOr<std::unique_ptr<Transport>> Worker::Impl::ConnectTransport(
    const StageAssignment& assignment, int num_stages, int report_rank,
    const std::string& transport_id, ActiveJob* job) {
  const std::string& job_id = assignment.job_id();
  const int s = assignment.stage();
  if (assignment.peer_addresses_size() != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StageAssignment.peer_addresses: the job has ", num_stages,
        " stages, got ", assignment.peer_addresses_size(), " addresses"));
  }
  ASSIGN_OR_RETURN(
      const TransportChoice choice,
      ChooseAssignmentTransport(assignment, num_stages, NcclTransportBuilt()));
  if (assignment.placements_size() > 0) {
    // The other ranks chose from this placement: it must be where this
    // worker really computes.
    const std::string& mine = assignment.placements(s).device();
    absl::StatusOr<Device> placed = ParseDevice(mine);
    if (!placed.ok() || *placed != device_) {
      return absl::InvalidArgumentError(
          absl::StrCat("StageAssignment.placements[", s, "].device: \"", mine,
                       "\", but this worker runs on ", device_.ToString()));
    }
  }
  LOG(INFO) << "trainyard-worker " << options_.name << ": job " << job_id
            << " stage " << s << " transport " << TransportKindName(choice.kind)
            << ": " << choice.reason;
  Report(TransportMessage(job_id, report_rank, choice));
  if (job->cancel_flag()->load()) return job->abort_reason().first;

  if (choice.kind == TransportKind::kNccl) {
    absl::StatusOr<std::unique_ptr<Transport>> created =
        CreateNccl(job_id, transport_id, s, num_stages, job);
    if (!created.ok()) {
      return Prefixed(created.status(),
                      "creating the NCCL transport to the other stages: ");
    }
    return created;
  }
  std::vector<std::string> peers(assignment.peer_addresses().begin(),
                                 assignment.peer_addresses().end());
  absl::StatusOr<std::unique_ptr<Transport>> connected =
      connect_transport_(transport_id, s, peers, assignment.data_plane_secret(),
                         job->cancel_flag());
  if (!connected.ok()) {
    return Prefixed(connected.status(), "connecting to the other stages: ");
  }
  return connected;
}

absl::StatusOr<std::unique_ptr<Transport>> Worker::Impl::CreateNccl(
    const std::string& job_id, const std::string& transport_id, int rank,
    int world_size, ActiveJob* job) {
  // Through whichever session is live: a request made while none is fails
  // (the rendezvous needs the controller).
  RemoteRendezvous rendezvous(
      absl::StrCat("controller ", options_.controller),
      [this, job_id](const RemoteRendezvous::Request& request) {
        return SendLive(RendezvousMessage(job_id, request));
      });
  job->SetRendezvous(&rendezvous);
  NcclTransportOptions nccl;
  nccl.job_id = transport_id;
  nccl.rank = rank;
  nccl.world_size = world_size;
  nccl.device = device_.index;
  nccl.rendezvous = &rendezvous;
  // Creation is the NCCL form of connecting to the peers: bounded like a
  // TCP connect (and never longer than a stage's wait for a neighbour), so
  // an aborted job whose creation cannot be interrupted (NCCL's own join)
  // still ends within the time OnAssign gives it.
  nccl.init_timeout =
      std::min(options_.stage_timeout, options_.peer_connect_timeout);
  nccl.payload_timeout = options_.stage_timeout;
  nccl.shutdown_timeout = options_.stage_timeout;
  nccl.cancel = job->cancel_flag();
  absl::StatusOr<std::unique_ptr<Transport>> created =
      create_nccl_transport_(nccl);
  job->SetRendezvous(nullptr);
  return created;
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
