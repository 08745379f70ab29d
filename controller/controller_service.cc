#include "controller/controller_service.h"

#include <chrono>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "controller/request_parsing.h"
#include "glog/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "net/address.h"

namespace trainyard {
namespace {

using v1::ControllerMessage;
using v1::JobEvent;
using v1::WorkerMessage;
using WorkerReactor =
    grpc::ServerBidiReactor<ParsedRequest<WorkerMessage>, ControllerMessage>;

// A server stream that writes what NextLocked() picks, one write in
// flight, until there is nothing left and FinishedLocked() says the stream
// is over (or the client cancels, or a write fails). Subclasses call Pump()
// whenever something new may be readable.
//
// Lifetime: owned by itself through self_ (set by the subclass's Create)
// until OnDone; the sources that notify it hold only a weak_ptr, so a
// notification racing with OnDone finds either a live object (and
// `finished_`) or none.
template <typename T>
class PumpedStream : public grpc::ServerWriteReactor<T> {
 public:
  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) cancelled_ = true;
    }
    Pump();
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    Pump();
  }

  void OnDone() override {
    Closed();
    std::shared_ptr<void> keep = std::move(self_);
  }

 protected:
  // The next message into *out; false when there is none right now.
  virtual bool NextLocked(T* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // With nothing to write: whether the stream is over (else it waits for
  // the next Pump()).
  virtual bool FinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // Called once, from OnDone.
  virtual void Closed() {}

  void Pump() {
    absl::MutexLock lock(&mu_);
    if (writing_ || finished_) return;
    if (cancelled_) {
      finished_ = true;
      this->Finish(
          grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
      return;
    }
    if (NextLocked(&buf_)) {
      writing_ = true;
      this->StartWrite(&buf_);
      return;
    }
    if (!error_.ok()) {
      finished_ = true;
      this->Finish(error_);
      return;
    }
    if (FinishedLocked()) {
      finished_ = true;
      this->Finish(grpc::Status::OK);
    }
  }

  std::shared_ptr<void> self_;
  absl::Mutex mu_;
  // Set by NextLocked when the stream cannot go on: it ends with this once
  // what NextLocked returned before is written.
  grpc::Status error_ ABSL_GUARDED_BY(mu_);

 private:
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  T buf_ ABSL_GUARDED_BY(mu_);  // the message being written
};

// WatchJob: the current state, then the job's steps/evals/notes from
// from_step on (replayed from the event log), then live events; ends after
// the terminal state. Reads the shared JobEventLog with its own cursor; at
// most one write is in flight, so a slow client only holds back its own
// cursor.
class WatchReactor final : public PumpedStream<JobEvent>,
                           public JobEventLog::Listener,
                           public std::enable_shared_from_this<WatchReactor> {
 public:
  // `open` counts the open watches (for /metrics) while this one lives.
  static WatchReactor* Create(std::shared_ptr<JobEventLog> log,
                              const std::string& job_id, int64_t from_step,
                              std::shared_ptr<std::atomic<int64_t>> open) {
    std::shared_ptr<WatchReactor> r(
        new WatchReactor(std::move(log), job_id, from_step));
    r->open_ = std::move(open);
    r->open_->fetch_add(1);
    r->self_ = r;
    JobEventLog::Snapshot snap = r->log_->Subscribe(r);
    {
      absl::MutexLock lock(&r->mu_);
      r->first_.set_job_id(job_id);
      *r->first_.mutable_state() = snap.state;
      r->boundary_ = snap.size;
    }
    r->Pump();
    return r.get();
  }

  void OnJobEvents() override { Pump(); }

 private:
  WatchReactor(std::shared_ptr<JobEventLog> log, std::string job_id,
               int64_t from_step)
      : log_(std::move(log)),
        job_id_(std::move(job_id)),
        from_step_(from_step) {}

  void Closed() override { open_->fetch_sub(1); }

  bool FinishedLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return terminal_;
  }

  bool NextLocked(JobEvent* out) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // The current state goes first, so a watcher knows where the job
    // stands; for a finished job it goes last instead, after the replayed
    // history, so "stop at the terminal state" never skips the history.
    const bool finished_job = IsTerminal(first_.state().state());
    if (!sent_first_ && !finished_job) {
      sent_first_ = true;
      *out = first_;
      return true;
    }
    while (true) {
      if (next_ == read_.size()) {
        read_.clear();
        next_ = 0;
        absl::Status st =
            log_->Read(cursor_, JobEventLog::kEventsPerRead, &read_);
        if (!st.ok()) {
          error_ = ToGrpcStatus(absl::Status(
              st.code(),
              absl::StrCat("watching job ", job_id_, ": ", st.message())));
          return false;
        }
        if (read_.empty()) break;
      }
      JobEvent& ev = read_[next_++];
      const int64_t index = cursor_++;
      if (ev.has_state()) {
        // States before the snapshot are summed up by first_.
        if (index < boundary_) continue;
        if (IsTerminal(ev.state().state())) terminal_ = true;
      } else if (ev.has_step()) {
        if (ev.step().step() < from_step_) continue;
      } else if (ev.has_eval()) {
        if (ev.eval().step() < from_step_) continue;
      } else if (ev.has_note()) {
        if (ev.note().step() < from_step_) continue;
      } else if (ev.has_recovery()) {
        if (ev.recovery().step() < from_step_) continue;
      } else if (!ev.has_progress()) {
        continue;
      }
      *out = std::move(ev);
      out->set_job_id(job_id_);
      return true;
    }
    if (!sent_first_ && finished_job) {
      sent_first_ = true;
      terminal_ = true;
      *out = first_;
      return true;
    }
    return false;
  }

  const std::shared_ptr<JobEventLog> log_;
  const std::string job_id_;
  const int64_t from_step_;
  std::shared_ptr<std::atomic<int64_t>> open_;

  JobEvent first_ ABSL_GUARDED_BY(mu_);
  int64_t boundary_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cursor_ ABSL_GUARDED_BY(mu_) = 0;  // the next event to send
  // Events read ahead: read_[next_] is event cursor_.
  std::vector<JobEvent> read_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  bool sent_first_ ABSL_GUARDED_BY(mu_) = false;
  bool terminal_ ABSL_GUARDED_BY(mu_) = false;
};

using FailedWatch = FailedStream<JobEvent>;

// WatchLogs: the job's log lines from from_seq on, then (follow) new ones
// until the ring is closed (the job ended). The ring holds a weak_ptr.
class LogsReactor final : public PumpedStream<v1::LogLine>,
                          public LogRing::Listener,
                          public std::enable_shared_from_this<LogsReactor> {
 public:
  static LogsReactor* Create(std::shared_ptr<LogRing> ring, int64_t from_seq,
                             bool follow) {
    std::shared_ptr<LogsReactor> r(
        new LogsReactor(std::move(ring), from_seq, follow));
    r->self_ = r;
    const LogRing::Snapshot snap =
        follow ? r->ring_->Subscribe(r) : r->ring_->state();
    {
      absl::MutexLock lock(&r->mu_);
      r->end_ = snap.end;
    }
    r->Pump();
    return r.get();
  }

  void OnLogLines() override { Pump(); }

 private:
  LogsReactor(std::shared_ptr<LogRing> ring, int64_t from_seq, bool follow)
      : ring_(std::move(ring)), follow_(follow), cursor_(from_seq) {}

  bool NextLocked(v1::LogLine* out) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Closed is read before the line: no line is appended after the close,
    // so a closed ring with nothing left to read is done.
    closed_ = ring_->state().closed;
    if ((follow_ || cursor_ < end_) && ring_->Read(&cursor_, out) &&
        (follow_ || out->seq() < end_)) {
      ++cursor_;
      return true;
    }
    return false;
  }

  bool FinishedLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !follow_ || closed_;
  }

  const std::shared_ptr<LogRing> ring_;
  const bool follow_;

  int64_t cursor_ ABSL_GUARDED_BY(mu_);
  int64_t end_ ABSL_GUARDED_BY(mu_) = 0;      // without follow: stop here
  bool closed_ ABSL_GUARDED_BY(mu_) = false;  // as of the last NextLocked
};

// A worker stream refused before its first read.
class RefusedWorker final : public WorkerReactor {
 public:
  explicit RefusedWorker(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// WorkerService.Connect: the controller's end of one worker's stream.
// Reads drive the JobManager; writes come from the manager (WorkerLink) and
// are queued, one in flight at a time.
class WorkerStream final : public WorkerReactor,
                           public WorkerLink,
                           public std::enable_shared_from_this<WorkerStream> {
 public:
  static WorkerStream* Create(JobManager* manager,
                              grpc::CallbackServerContext* context) {
    std::shared_ptr<WorkerStream> s(new WorkerStream(manager, context));
    s->self_ = s;
    absl::MutexLock lock(&s->mu_);
    s->StartRead(&s->in_);
    return s.get();
  }

  void OnReadDone(bool ok) override {
    std::shared_ptr<WorkerStream> hold = shared_from_this();
    if (!ok) {
      if (!id_.empty()) {
        manager_->OnWorkerStreamEnded(id_,
                                      "its stream to the controller "
                                      "closed",
                                      this);
      }
      Close(absl::OkStatus());
      return;
    }
    if (!in_.status.ok()) {
      const std::string why = absl::StrCat(
          "a message on its stream is not a valid ",
          WorkerMessage::descriptor()->full_name(), ": ", in_.status.message());
      // Closed first, so that the worker sees this status rather than the
      // one the manager closes a lost worker's stream with.
      Close(absl::InvalidArgumentError(
          absl::StrCat("WorkerService.Connect from ", peer_, ": ", why)));
      if (!id_.empty()) manager_->OnWorkerStreamEnded(id_, why, this);
      return;
    }
    const WorkerMessage& in = in_.message;
    if (id_.empty()) {
      if (in.msg_case() != WorkerMessage::kRegister) {
        Close(absl::InvalidArgumentError(
            absl::StrCat("WorkerService.Connect from ", peer_,
                         ": the first message must be RegisterWorker, got ",
                         in.msg_case() == WorkerMessage::MSG_NOT_SET
                             ? std::string("an empty message")
                             : in.GetDescriptor()
                                   ->FindFieldByNumber(in.msg_case())
                                   ->name())));
        return;
      }
      absl::StatusOr<std::string> id =
          manager_->RegisterWorker(in.register_(), hold);
      if (!id.ok()) {
        Close(id.status());
        return;
      }
      id_ = *id;  // only this (serialized) read path touches id_
    } else {
      manager_->OnWorkerMessage(id_, in, this);
    }
    absl::MutexLock lock(&mu_);
    if (!finish_called_) StartRead(&in_);
  }

  void Send(const ControllerMessage& msg) override {
    absl::MutexLock lock(&mu_);
    if (finish_called_ || close_pending_) return;
    out_.push_back(msg);
    if (!writing_) {
      writing_ = true;
      StartWrite(&out_.front());
    }
  }

  void Close(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    if (finish_called_ || close_pending_) return;
    close_pending_ = true;
    close_status_ = ToGrpcStatus(status);
    if (!writing_) {
      finish_called_ = true;
      Finish(close_status_);
    }
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    out_.pop_front();
    if (!ok) out_.clear();  // the stream is broken; reads will report it
    if (!out_.empty()) {
      StartWrite(&out_.front());
      return;
    }
    writing_ = false;
    if (close_pending_ && !finish_called_) {
      finish_called_ = true;
      Finish(close_status_);
    }
  }

  void OnDone() override {
    std::shared_ptr<WorkerStream> keep = std::move(self_);
  }

 private:
  WorkerStream(JobManager* manager, grpc::CallbackServerContext* context)
      : manager_(manager), peer_(context->peer()) {}

  JobManager* const manager_;
  const std::string peer_;
  std::shared_ptr<WorkerStream> self_;
  ParsedRequest<WorkerMessage> in_;  // used only by the read path
  std::string id_;                   // set once registered; read path only

  absl::Mutex mu_;
  std::deque<ControllerMessage> out_ ABSL_GUARDED_BY(mu_);  // front in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool close_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status close_status_ ABSL_GUARDED_BY(mu_);
};

template <typename T>
grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context,
                                absl::StatusOr<T> result, T* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (result.ok()) *response = *std::move(result);
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

JobManagerOptions ManagerOptions(const ControllerOptions& options) {
  JobManagerOptions manager;
  manager.data_dir = options.data_dir;
  manager.heartbeat_interval = options.heartbeat_interval;
  manager.heartbeat_timeout = options.heartbeat_timeout;
  manager.adopt_timeout = options.adopt_timeout;
  manager.drain_timeout = options.drain_timeout;
  manager.events_in_memory = options.events_in_memory;
  manager.job_data_dir = options.job_data_dir;
  manager.plugin_dir = options.plugin_dir;
  return manager;
}

prometheus::Histogram& SubmitSecondsHistogram(prometheus::Registry& registry) {
  return prometheus::BuildHistogram()
      .Name("trainyard_submit_seconds")
      .Help("SubmitJob latency at the controller, seconds.")
      .Register(registry)
      .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.002,
                                                       0.005, 0.01, 0.02, 0.05,
                                                       0.1, 0.2, 0.5, 1, 2, 5});
}

// The controller's gauges and counters, read at each scrape.
std::vector<prometheus::MetricFamily> ControllerMetrics(
    JobManager* manager, const JobServiceImpl* jobs) {
  const ControllerStats s = manager->GetStats();
  LabeledValues by_state, workers;
  for (const auto& [state, n] : s.jobs) {
    by_state.push_back(
        {{{"state", v1::JobState_Name(state)}}, static_cast<double>(n)});
  }
  for (const auto& [key, n] : s.workers) {
    workers.push_back({{{"device", key.first}, {"state", key.second}},
                       static_cast<double>(n)});
  }
  std::vector<prometheus::MetricFamily> out;
  out.push_back(GaugeFamily("trainyard_jobs", "Jobs by state.", by_state));
  out.push_back(
      GaugeFamily("trainyard_jobs_queued",
                  "Jobs waiting to be scheduled (queued, or restarting).",
                  {{{}, static_cast<double>(s.queued)}}));
  out.push_back(GaugeFamily(
      "trainyard_workers", "Registered workers by device and state.", workers));
  out.push_back(GaugeFamily("trainyard_watchers", "Open WatchJob streams.",
                            {{{}, static_cast<double>(jobs->watchers())}}));
  out.push_back(CounterFamily(
      "trainyard_job_restarts_total",
      "Automatic restarts (recoveries) of jobs, all jobs together.",
      {{{}, static_cast<double>(s.restarts)}}));
  return out;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

JobServiceImpl::JobServiceImpl(JobManager* manager,
                               prometheus::Histogram* submit_seconds,
                               TokenTable* tokens)
    : manager_(manager), submit_seconds_(submit_seconds), tokens_(tokens) {
  // Each method is registered again over its parsed request, replacing the
  // handler the generated CallbackService registered.
  AuthenticateFn authenticate = [this](grpc::CallbackServerContext* context) {
    return ToGrpcStatus(Authenticate(context).status());
  };
  int parsed = 0;
  auto parse = [&](const char* method, auto typed) {
    ++parsed;
    MarkMethodCallback(
        MethodIndex("trainyard.v1.JobService", method,
                    *RequestOf<decltype(typed)>::Type::descriptor()),
        ParsingHandler(method, authenticate, this, typed));
  };
  parse("SubmitJob", &JobServiceImpl::SubmitJob);
  parse("GetJob", &JobServiceImpl::GetJob);
  parse("ListJobs", &JobServiceImpl::ListJobs);
  parse("CancelJob", &JobServiceImpl::CancelJob);
  parse("WatchJob", &JobServiceImpl::WatchJob);
  parse("ListWorkers", &JobServiceImpl::ListWorkers);
  parse("GetTrace", &JobServiceImpl::GetTrace);
  parse("WatchLogs", &JobServiceImpl::WatchLogs);
  // A method left out would still get gRPC's UNIMPLEMENTED for bad bytes.
  CHECK_EQ(parsed, v1::SubmitJobRequest::descriptor()
                       ->file()
                       ->FindServiceByName("JobService")
                       ->method_count());
}

absl::StatusOr<Caller> JobServiceImpl::Authenticate(
    grpc::CallbackServerContext* context) {
  if (tokens_ == nullptr) return Caller{"", true};
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  return tokens_->Authenticate(
      it == metadata.end()
          ? absl::string_view()
          : absl::string_view(it->second.data(), it->second.size()));
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(
    grpc::CallbackServerContext* context, const v1::SubmitJobRequest* request,
    v1::Job* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<Caller> caller = Authenticate(context);
  grpc::ServerUnaryReactor* reactor =
      Reply(context,
            caller.ok() ? manager_->SubmitJob(*request, *caller)
                        : absl::StatusOr<v1::Job>(caller.status()),
            response);
  if (submit_seconds_ != nullptr) {
    submit_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(
    grpc::CallbackServerContext* context, const v1::GetJobRequest* request,
    v1::Job* response) {
  absl::StatusOr<Caller> caller = Authenticate(context);
  if (!caller.ok()) return Reply<v1::Job>(context, caller.status(), response);
  return Reply(context, manager_->GetJob(request->job_id(), *caller), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(
    grpc::CallbackServerContext* context, const v1::ListJobsRequest* request,
    v1::ListJobsResponse* response) {
  absl::StatusOr<Caller> caller = Authenticate(context);
  if (!caller.ok()) {
    return Reply<v1::ListJobsResponse>(context, caller.status(), response);
  }
  return Reply(context, manager_->ListJobs(*request, *caller), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListWorkers(
    grpc::CallbackServerContext* context, const v1::ListWorkersRequest*,
    v1::ListWorkersResponse* response) {
  // Any authenticated user may see the workers (capacity, placement); they
  // carry no job specs.
  absl::StatusOr<Caller> caller = Authenticate(context);
  if (!caller.ok()) {
    return Reply<v1::ListWorkersResponse>(context, caller.status(), response);
  }
  for (const WorkerInfo& w : manager_->ListWorkers()) {
    v1::WorkerStatus* out = response->add_workers();
    out->set_worker_id(w.id);
    out->set_name(w.name);
    *out->mutable_capabilities() = w.caps;
    out->set_job_id(w.job_id);
    out->set_stage(w.job_id.empty() ? -1 : w.rank);
    out->set_last_heartbeat_ms_ago(
        absl::ToInt64Milliseconds(w.since_heartbeat));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(
    grpc::CallbackServerContext* context, const v1::CancelJobRequest* request,
    v1::Job* response) {
  absl::StatusOr<Caller> caller = Authenticate(context);
  if (!caller.ok()) return Reply<v1::Job>(context, caller.status(), response);
  return Reply(context, manager_->CancelJob(*request, *caller), response);
}

grpc::ServerWriteReactor<JobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  absl::StatusOr<Caller> caller = Authenticate(context);
  if (!caller.ok()) return new FailedWatch(ToGrpcStatus(caller.status()));
  absl::StatusOr<std::shared_ptr<JobEventLog>> log =
      manager_->WatchJob(request->job_id(), *caller);
  if (!log.ok()) return new FailedWatch(ToGrpcStatus(log.status()));
  if (request->from_step() < 0) {
    return new FailedWatch(ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("from_step: must be >= 0, got ", request->from_step()))));
  }
  return WatchReactor::Create(*std::move(log), request->job_id(),
                              request->from_step(), watchers_);
}

grpc::ServerUnaryReactor* JobServiceImpl::GetTrace(
    grpc::CallbackServerContext* context, const v1::GetTraceRequest* request,
    v1::GetTraceResponse* response) {
  absl::StatusOr<Caller> caller = Authenticate(context);
  if (!caller.ok()) {
    return Reply<v1::GetTraceResponse>(context, caller.status(), response);
  }
  return Reply(context, manager_->GetTrace(*request, *caller), response);
}

grpc::ServerWriteReactor<v1::LogLine>* JobServiceImpl::WatchLogs(
    grpc::CallbackServerContext* context, const v1::WatchLogsRequest* request) {
  using Failed = FailedStream<v1::LogLine>;
  absl::StatusOr<Caller> caller = Authenticate(context);
  if (!caller.ok()) return new Failed(ToGrpcStatus(caller.status()));
  if (request->from_seq() < 0) {
    return new Failed(ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("from_seq: must be >= 0, got ", request->from_seq()))));
  }
  absl::StatusOr<std::shared_ptr<LogRing>> ring =
      manager_->WatchLogs(request->job_id(), *caller);
  if (!ring.ok()) return new Failed(ToGrpcStatus(ring.status()));
  return LogsReactor::Create(*std::move(ring), request->from_seq(),
                             request->follow());
}

WorkerServiceImpl::WorkerServiceImpl(JobManager* manager,
                                     bool require_certificate)
    : manager_(manager), require_certificate_(require_certificate) {
  // Connect reads ParsedRequest<WorkerMessage>, so that a message that does
  // not parse ends the stream with INVALID_ARGUMENT instead of looking like
  // the worker's half-close.
  MarkMethodCallback(
      MethodIndex("trainyard.v1.WorkerService", "Connect",
                  *WorkerMessage::descriptor()),
      new grpc::internal::CallbackBidiHandler<ParsedRequest<WorkerMessage>,
                                              ControllerMessage>(
          [this](grpc::CallbackServerContext* context) {
            return ConnectParsed(context);
          }));
}

grpc::ServerBidiReactor<ParsedRequest<v1::WorkerMessage>,
                        v1::ControllerMessage>*
WorkerServiceImpl::ConnectParsed(grpc::CallbackServerContext* context) {
  if (require_certificate_ && !PeerHasVerifiedCertificate(*context)) {
    LOG(WARNING) << "WorkerService.Connect from " << context->peer()
                 << " refused: no client certificate";
    return new RefusedWorker(grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        "WorkerService needs a client certificate signed by the cluster CA: "
        "start the worker with --tls_cert and --tls_key (e.g. worker.pem and "
        "worker.key from `trainyard certs`)"));
  }
  return WorkerStream::Create(manager_, context);
}

absl::StatusOr<std::unique_ptr<ControllerServer>> ControllerServer::Start(
    const ControllerOptions& options) {
  absl::StatusOr<std::unique_ptr<JobManager>> manager =
      JobManager::Create(ManagerOptions(options));
  if (!manager.ok()) return manager.status();

  std::unique_ptr<ControllerServer> server(new ControllerServer());
  server->manager_ = *std::move(manager);
  absl::Status started = server->Serve(options);
  if (!started.ok()) {
    server->manager_->Shutdown();
    return started;
  }
  return server;
}

absl::Status ControllerServer::Serve(const ControllerOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  if (!options.tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenTable>> tokens =
        TokenTable::Load(options.tokens_file);
    if (!tokens.ok()) return tokens.status();
    tokens_ = *std::move(tokens);
  }
  prometheus::Histogram* submit_seconds = nullptr;
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics =
        MetricsEndpoint::Start(options.metrics_listen);
    if (!metrics.ok()) return metrics.status();
    metrics_ = *std::move(metrics);
    submit_seconds = &SubmitSecondsHistogram(metrics_->registry());
  }
  job_service_ = std::make_unique<JobServiceImpl>(
      manager_.get(), submit_seconds, tokens_.get());
  if (metrics_ != nullptr) {
    JobManager* manager = manager_.get();
    JobServiceImpl* jobs = job_service_.get();
    metrics_->AddCollector(
        [manager, jobs] { return ControllerMetrics(manager, jobs); });
  }
  worker_service_ = std::make_unique<WorkerServiceImpl>(
      manager_.get(),
      /*require_certificate=*/!options.tls.insecure &&
          !options.tls.ca_file.empty());
  return Listen(options, *credentials);
}

absl::Status ControllerServer::Listen(
    const ControllerOptions& options,
    const std::shared_ptr<grpc::ServerCredentials>& credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Workers and watchers send HTTP/2 keepalive pings (every 10 s, also on
  // idle streams) so a half-open connection is noticed; accept them.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  int port = 0;
  builder.AddListeningPort(options.listen, credentials, &port);
  builder.RegisterService(job_service_.get());
  builder.RegisterService(worker_service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.listen, " (address in use or invalid?)"));
  }
  port_ = port;
  std::string host = HostOfAddress(options.listen);
  if (host.empty() || host == "0.0.0.0" || host == "::") host = "127.0.0.1";
  address_ = absl::StrCat(host, ":", port);
  LOG(INFO) << "trainyard-controller serving on " << address_
            << (options.tls.insecure ? " (plaintext)" : " (TLS)")
            << ", data in " << options.data_dir
            << (tokens_ != nullptr
                    ? absl::StrCat(", tokens from ", options.tokens_file)
                    : std::string(", no authentication"));
  return absl::OkStatus();
}

void ControllerServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // Its collector reads the manager and the job service.
  metrics_.reset();
  manager_->Shutdown();
  // Open streams (watchers, workers that do not hang up) are cancelled
  // after a short grace period.
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(200));
  server_->Wait();
}

void ControllerServer::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&shut_down_));
}

ControllerServer::~ControllerServer() {
  if (server_ != nullptr) Shutdown();
}

}  // namespace trainyard
