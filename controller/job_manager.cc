#include "controller/job_manager.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "net/address.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "controller/scheduler.h"
#include "plan/job_plan.h"
#include "core/sha256.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "engine/task_loader.h"

namespace trainyard {
namespace {

using v1::Job;
using v1::JobEvent;
using v1::JobState;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

PlanOptions ControllerPlanOptions(const JobManagerOptions& manager) {
  PlanOptions options = PlanOptions::ShapeOnly();
  if (!manager.job_data_dir.empty()) {
    // Relative paths resolve on the workers, against the same folder.
    options.base_dir = manager.job_data_dir;
    options.confine_to = manager.job_data_dir;
    options.confine_flag = "the controller's --job_data_dir";
  }
  return options;
}

// "stage 3", or with replicas "rank 3 (stage 1 of replica 1)".
std::string RankLabel(int rank, int num_ranks, int replicas) {
  if (replicas <= 1) return absl::StrCat("stage ", rank);
  const Gang gang{num_ranks / replicas, replicas};
  return absl::StrCat("rank ", rank, " (stage ", gang.StageOf(rank),
                      " of replica ", gang.ReplicaOf(rank), ")");
}

std::string WorkerLabel(const std::string& id, const std::string& name) {
  return absl::StrCat(id, " (", name, ")");
}

// Where a worker's stages run, for the transport choice of its jobs: the
// hostname it registered (the same for every interface of one machine),
// else the host it advertises to peers.
v1::StagePlacement PlacementOf(const v1::WorkerCapabilities& caps) {
  v1::StagePlacement p;
  p.set_host(caps.hostname().empty() ? HostOfAddress(caps.peer_address())
                                     : caps.hostname());
  p.set_device(caps.device().empty() ? "cpu" : caps.device());
  return p;
}

v1::ControllerMessage RendezvousRefusal(int64_t request_id,
                                        const absl::Status& why) {
  v1::ControllerMessage msg;
  v1::RendezvousReply* reply = msg.mutable_rendezvous_reply();
  reply->set_request_id(request_id);
  reply->set_code(static_cast<int32_t>(why.code()));
  reply->set_error(std::string(why.message()));
  return msg;
}

// A reconnecting worker may keep an id up to this far beyond the newest one
// given out (ids stay small, and the counter cannot overflow).
constexpr int64_t kMaxWorkerIdAhead = 1000000;

// Longest note text kept in a job's history; a worker's reason is cut
// there.
constexpr size_t kMaxNoteBytes = 1024;

// Client-chosen strings that are stored with a job.
constexpr size_t kMaxRequestIdBytes = 256;
constexpr size_t kMaxCancelReasonBytes = 1024;

constexpr int kDefaultPageSize = 50;
constexpr size_t kMaxListResponseBytes = size_t{2} << 20;
constexpr int kMaxPageSize = 1000;
constexpr char kTokenPrefix[] = "before:";

void RestorePath(const std::string& submitted, std::string* normalized) {
  if (!submitted.empty() && submitted[0] != '/') *normalized = submitted;
}

void RestoreSource(const v1::DataSource& submitted, v1::DataSource* out) {
  if (submitted.has_npy() && out->has_npy()) {
    RestorePath(submitted.npy().features(),
                out->mutable_npy()->mutable_features());
    RestorePath(submitted.npy().targets(),
                out->mutable_npy()->mutable_targets());
  }
}

// "restart 2 of 3".
std::string RestartLabel(const Job& job, int max_restarts) {
  return absl::StrCat("restart ", job.restarts(), " of ", max_restarts);
}

}  // namespace

bool IsRecoverableStageFailure(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kUnauthenticated:
      return false;
    default:
      return true;
  }
}

v1::JobSpec WorkerSpec(const v1::JobSpec& submitted,
                       const v1::JobSpec& plan_spec) {
  v1::JobSpec spec = plan_spec;
  RestoreSource(submitted.data().train(), spec.mutable_data()->mutable_train());
  if (spec.data().has_eval()) {
    RestoreSource(submitted.data().eval(), spec.mutable_data()->mutable_eval());
  }
  RestorePath(submitted.model().init().safetensors(),
              spec.mutable_model()->mutable_init()->mutable_safetensors());
  RestorePath(submitted.checkpoint().dir(),
              spec.mutable_checkpoint()->mutable_dir());
  return spec;
}

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(
    const JobManagerOptions& options) {
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_timeout (", absl::FormatDuration(options.heartbeat_timeout),
        ") must be greater than heartbeat_interval (",
        absl::FormatDuration(options.heartbeat_interval), ") > 0"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store,
                   JobStore::Open(options.data_dir));
  std::unique_ptr<JobManager> manager(
      new JobManager(options, std::move(store)));
  RETURN_IF_ERROR(manager->Load());
  manager->liveness_ = std::thread([m = manager.get()] { m->LivenessLoop(); });
  return manager;
}

JobManager::JobManager(const JobManagerOptions& options,
                       std::unique_ptr<JobStore> store)
    : options_(options),
      store_(std::move(store)),
      rendezvous_(options.rendezvous_limits) {}

JobManager::~JobManager() { Shutdown(); }

absl::Status JobManager::Load() {
  ASSIGN_OR_RETURN(std::vector<Job> jobs, store_->LoadJobs());
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  int64_t order = 0;
  for (Job& job : jobs) {
    auto e = std::make_unique<JobEntry>();
    e->order = ++order;
    e->job = std::move(job);
    job_by_request_[RequestKey(e->job.owner(), e->job.request_id())] =
        e->job.job_id();
    JobEntry& entry = *e;
    jobs_[e->job.job_id()] = std::move(e);
    // Worker ids stay unique across restarts, so a reconnecting worker can
    // keep its id without colliding with a new one.
    for (const std::string& id : entry.job.workers()) {
      int64_t n = 0;
      if (absl::StartsWith(id, "w-") && absl::SimpleAtoi(id.substr(2), &n)) {
        next_worker_ = std::max(next_worker_, n + 1);
      }
    }
    if (IsTerminal(entry.job.state())) continue;
    absl::StatusOr<JobPlan> plan =
        PlanJob(entry.job.spec(), ControllerPlanOptions(options_));
    if (!plan.ok()) {
      FinishJobLocked(entry, v1::FAILED,
                      absl::StrCat("spec no longer valid after restart: ",
                                   plan.status().message()),
                      false);
      continue;
    }
    SetPlanLocked(entry, *plan);
    switch (entry.job.state()) {
      case v1::RUNNING:
        // Its workers keep training while no controller listens; wait for
        // them to reconnect and claim their stages.
        entry.adopting = true;
        entry.adopt_deadline = now + options_.adopt_timeout;
        entry.claimed.assign(entry.num_stages, false);
        entry.stage_done.assign(entry.num_stages, 0);
        entry.transport_reported.assign(entry.num_stages, false);
        entry.resume_steps.assign(entry.num_stages, 0);
        rendezvous_.Open(entry.job.job_id());
        // Notes already in its history are not recorded again when the
        // workers resend their reports.
        for (int64_t i = 0;; ++i) {
          JobEvent ev;
          if (!LogLocked(entry)->Read(i, &ev)) break;
          if (ev.has_note()) entry.notes.insert(ev.note().text());
        }
        std::fill(entry.transport_reported.begin(),
                  entry.transport_reported.end(), true);
        LOG(INFO) << "job " << entry.job.job_id()
                  << " was RUNNING: waiting up to "
                  << absl::FormatDuration(options_.adopt_timeout)
                  << " for its workers to reclaim its " << entry.num_stages
                  << " stage(s)";
        break;
      case v1::RECOVERING:
        // The old gang was being stopped, and may not have heard so: wait
        // for its workers to reconnect (their claims are refused, and they
        // stop) or for adopt_timeout, after which a worker still cut off
        // from the controller has stopped its stage by itself.
        entry.detected = now;
        entry.detected_step = entry.job.steps_completed();
        entry.restart_not_before = now;
        for (const std::string& w : entry.job.workers()) {
          if (!w.empty()) entry.draining.insert(w);
        }
        entry.drain_deadline = now + options_.adopt_timeout;
        MaybeRequeueLocked(entry, now);
        break;
      default:
        queued_.insert(entry.job.job_id());
        break;
    }
  }
  return absl::OkStatus();
}

void JobManager::SetPlanLocked(JobEntry& e, const JobPlan& plan) {
  e.replicas = plan.num_replicas();
  e.num_stages = plan.gang().size();
  e.loss_rank = plan.gang().RankOf(e.replicas - 1, plan.loss_stage());
  e.normalized = WorkerSpec(e.job.spec(), plan.spec);
  e.max_restarts = e.normalized.recovery().max_restarts();
  e.backoff_ms = e.normalized.recovery().backoff_ms();
}

void JobManager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    for (auto& [id, w] : workers_) {
      Outgoing out;
      out.link = w.link;
      out.close = true;
      out.status = absl::UnavailableError("controller shutting down");
      outbox_.push_back(std::move(out));
    }
    workers_.clear();
  }
  if (liveness_.joinable()) liveness_.join();
  Deliver();
}

void JobManager::LivenessLoop() {
  const absl::Duration period =
      std::min(options_.heartbeat_interval / 2, absl::Milliseconds(100));
  absl::MutexLock lock(&mu_);
  while (!shutting_down_) {
    mu_.AwaitWithTimeout(absl::Condition(&shutting_down_), period);
    if (shutting_down_) break;
    const absl::Time now = absl::Now();
    SettleFailuresLocked(now);
    SendRendezvousRepliesLocked(rendezvous_.Expire(now));
    std::vector<std::pair<std::string, absl::Duration>> lost;
    for (const auto& [id, w] : workers_) {
      absl::Duration silent = now - w.last_seen;
      if (silent > options_.heartbeat_timeout) lost.emplace_back(id, silent);
    }
    for (const auto& [id, silent] : lost) {
      LoseWorkerLocked(id, absl::StrFormat("no heartbeat for %.1f s",
                                           absl::ToDoubleSeconds(silent)));
    }
    mu_.Unlock();
    Deliver();
    mu_.Lock();
  }
}

void JobManager::Deliver() {
  {
    absl::MutexLock lock(&mu_);
    if (delivering_) return;  // the active deliverer will send ours too
    delivering_ = true;
  }
  while (true) {
    Outgoing out;
    {
      absl::MutexLock lock(&mu_);
      if (outbox_.empty()) {
        delivering_ = false;
        return;
      }
      out = std::move(outbox_.front());
      outbox_.pop_front();
    }
    if (out.close) {
      out.link->Close(out.status);
    } else {
      out.link->Send(out.msg);
    }
  }
}

void JobManager::SendLocked(const std::shared_ptr<WorkerLink>& link,
                            v1::ControllerMessage msg) {
  Outgoing out;
  out.link = link;
  out.msg = std::move(msg);
  outbox_.push_back(std::move(out));
}

std::string JobManager::TensorboardDir(const std::string& job_id) const {
  return absl::StrCat(options_.data_dir, "/tensorboard/", job_id);
}

void JobManager::WriteTensorboardLocked(JobEntry& e, const JobEvent& event) {
  if (e.tensorboard_failed) return;
  if (e.tensorboard == nullptr) {
    absl::StatusOr<std::unique_ptr<TensorboardWriter>> w =
        TensorboardWriter::Open(TensorboardDir(e.job.job_id()));
    if (!w.ok()) {
      e.tensorboard_failed = true;
      LOG(ERROR) << "job " << e.job.job_id()
                 << ": no TensorBoard events: " << w.status();
      return;
    }
    e.tensorboard = *std::move(w);
  }
  absl::Status st = e.tensorboard->Write(event);
  if (!st.ok()) {
    LOG(ERROR) << "job " << e.job.job_id() << ": " << st;
    e.tensorboard.reset();
    e.tensorboard_failed = true;
  }
}

JobEventLog* JobManager::LogLocked(JobEntry& e) {
  if (e.log == nullptr) {
    int64_t next_seq = 0;
    absl::StatusOr<std::vector<JobEvent>> events =
        store_->LoadEvents(e.job.job_id(), &next_seq);
    if (!events.ok()) {
      LOG(ERROR) << events.status();
      events = std::vector<JobEvent>();
    }
    e.next_seq = next_seq;
    if (events->empty()) {
      // Keep the invariant that a log starts with the job's state, stored
      // like any other event.
      JobEvent first;
      first.set_job_id(e.job.job_id());
      first.mutable_state()->set_state(e.job.state());
      first.mutable_state()->set_reason(e.job.reason());
      absl::Status st = store_->UpdateJob(e.job, e.next_seq, &first);
      if (st.ok()) {
        ++e.next_seq;
      } else {
        LOG(ERROR) << "persisting job " << e.job.job_id() << ": " << st;
      }
      events->push_back(std::move(first));
    }
    e.log = std::make_shared<JobEventLog>(*std::move(events));
  }
  return e.log.get();
}

void JobManager::CommitLocked(JobEntry& e, JobEvent* event) {
  JobEventLog* log = LogLocked(e);
  if (event != nullptr) event->set_job_id(e.job.job_id());
  absl::Status st = store_->UpdateJob(e.job, e.next_seq, event);
  // The in-memory state goes on even if the disk write failed: running jobs
  // must keep being served; the error is loud in the log. The sequence
  // number advances only with a stored event, so a failed write leaves no
  // gap for the next one.
  if (!st.ok()) {
    LOG(ERROR) << "persisting job " << e.job.job_id() << ": " << st;
  } else if (event != nullptr) {
    ++e.next_seq;
  }
  if (event != nullptr) log->Append(*event);
}

void JobManager::SetStateLocked(JobEntry& e, JobState state,
                                const std::string& reason) {
  e.job.set_state(state);
  e.job.set_reason(reason);
  if (state == v1::RUNNING && e.job.start_time_ms() == 0) {
    e.job.set_start_time_ms(NowMs());
  }
  if (IsTerminal(state)) e.job.set_end_time_ms(NowMs());
  JobEvent event;
  event.mutable_state()->set_state(state);
  event.mutable_state()->set_reason(reason);
  CommitLocked(e, &event);
  if (IsTerminal(state)) EndTelemetryLocked(e);
}

TraceBuffer* JobManager::TracesLocked(JobEntry& e) {
  if (e.traces == nullptr && !IsTerminal(e.job.state())) {
    e.traces =
        std::make_unique<TraceBuffer>(e.num_stages, options_.trace_limits);
  }
  return e.traces.get();
}

LogRing* JobManager::LogRingLocked(JobEntry& e) {
  if (e.logs == nullptr && !IsTerminal(e.job.state())) {
    e.logs = std::make_shared<LogRing>(options_.log_limits);
  }
  return e.logs.get();
}

void JobManager::EndTelemetryLocked(JobEntry& e) {
  if (e.logs != nullptr) e.logs->Close();
  if (e.logs == nullptr && e.traces == nullptr) return;
  ended_with_telemetry_.push_back(e.job.job_id());
  while (static_cast<int>(ended_with_telemetry_.size()) >
         std::max(0, options_.keep_ended_jobs)) {
    auto it = jobs_.find(ended_with_telemetry_.front());
    ended_with_telemetry_.pop_front();
    if (it == jobs_.end()) continue;
    // Open WatchLogs streams keep their (closed) ring until they finish.
    it->second->logs.reset();
    it->second->traces.reset();
  }
}

void JobManager::FinishJobLocked(JobEntry& e, JobState state,
                                 const std::string& reason,
                                 bool cancel_workers) {
  for (auto& [id, w] : workers_) {
    if (w.job_id != e.job.job_id()) continue;
    if (cancel_workers) {
      v1::ControllerMessage msg;
      msg.mutable_cancel()->set_job_id(e.job.job_id());
      msg.mutable_cancel()->set_reason(reason);
      SendLocked(w.link, std::move(msg));
    }
    w.job_id.clear();
    w.stage = -1;
  }
  e.pending_steps.clear();
  e.draining.clear();
  e.adopting = false;
  e.tensorboard.reset();  // closes the event file
  e.pending_failure.clear();
  e.failure_deadline = absl::InfiniteFuture();
  queued_.erase(e.job.job_id());
  // Ranks still waiting for a key fail now, naming why, instead of waiting
  // out their timeouts.
  SendRendezvousRepliesLocked(rendezvous_.Close(
      e.job.job_id(),
      absl::AbortedError(absl::StrCat(
          "rendezvous of job ", e.job.job_id(), ": closed, the job ended ",
          v1::JobState_Name(state), reason.empty() ? "" : ": ", reason))));
  SetStateLocked(e, state, reason);
}

// ---- Scheduling.

void JobManager::ScheduleLocked() {
  if (shutting_down_) return;
  std::vector<SchedJob> queued;
  for (const std::string& id : queued_) {
    const JobEntry& e = *jobs_.at(id);
    SchedJob j;
    j.id = id;
    j.priority = e.job.priority();
    j.order = e.order;
    j.stages = e.num_stages / e.replicas;
    j.replicas = e.replicas;
    j.device = e.normalized.device();
    queued.push_back(std::move(j));
  }
  if (queued.empty()) return;
  // Workers that may hold snapshots of a restarting job come first, so
  // that its new gang can resume from them (ChooseSnapshotLocked).
  std::set<std::string> holders;
  for (const std::string& id : queued_) {
    const JobEntry& e = *jobs_.at(id);
    if (e.job.state() != v1::RECOVERING) continue;
    for (const auto& [step, per_stage] : e.snapshot_holders) {
      for (const std::set<std::string>& ids : per_stage) {
        for (const std::string& w : ids) {
          if (HoldsSnapshotsOfLocked(w, id)) holders.insert(w);
        }
      }
    }
  }
  std::vector<const WorkerEntry*> ordered;
  for (const auto& [id, w] : workers_) ordered.push_back(&w);
  std::sort(ordered.begin(), ordered.end(),
            [&holders](const WorkerEntry* a, const WorkerEntry* b) {
              const bool ha = holders.count(a->id) > 0;
              const bool hb = holders.count(b->id) > 0;
              if (ha != hb) return ha;
              return a->order < b->order;
            });
  std::vector<SchedWorker> workers;
  for (const WorkerEntry* w : ordered) {
    workers.push_back(
        {w->id, w->caps.device(),
         w->job_id.empty() && w->stale_job.empty() && !w->draining});
  }
  SchedDecision decision = Schedule(std::move(queued), workers);
  for (const SchedDecision::Start& start : decision.starts) {
    StartJobLocked(*jobs_.at(start.job_id), start.worker_ids);
  }
  for (const auto& [id, waiting] : decision.waiting) {
    JobEntry& e = *jobs_.at(id);
    const std::string reason =
        e.job.state() == v1::RECOVERING
            ? absl::StrCat(RestartLabel(e.job, e.max_restarts), ": ", waiting,
                           "; after: ",
                           e.job.restart_reasons().empty()
                               ? std::string("?")
                               : *e.job.restart_reasons().rbegin())
            : waiting;
    if (e.job.reason() == reason) continue;
    e.job.set_reason(reason);
    CommitLocked(e, nullptr);
  }
}

void JobManager::StartJobLocked(JobEntry& e,
                                const std::vector<std::string>& chosen) {
  const std::string& job_id = e.job.job_id();
  const bool restart = e.job.state() == v1::RECOVERING;
  std::vector<std::string> worker_ids = chosen;
  if (restart && e.job.workers_size() == static_cast<int>(chosen.size())) {
    // Workers of the last gang keep their stages: their snapshots are
    // local, and only the lost stages' state moves.
    std::vector<std::string> placed(chosen.size());
    std::set<std::string> rest(chosen.begin(), chosen.end());
    for (size_t k = 0; k < chosen.size(); ++k) {
      if (rest.erase(e.job.workers(k)) > 0) placed[k] = e.job.workers(k);
    }
    auto next = rest.begin();
    for (std::string& id : placed) {
      if (id.empty()) id = *next++;
    }
    worker_ids = std::move(placed);
  }
  std::optional<v1::SnapshotResume> snapshot;
  if (restart && !e.snapshots_failed) {
    snapshot = ChooseSnapshotLocked(e, worker_ids);
  }
  queued_.erase(job_id);
  e.job.clear_workers();
  v1::StageAssignment assign;
  assign.set_job_id(job_id);
  *assign.mutable_spec() = e.normalized;
  assign.set_attempt(e.job.restarts());
  assign.set_data_plane_secret(RandomBytes(32));
  e.from_snapshot = snapshot.has_value();
  if (snapshot.has_value()) {
    *assign.mutable_snapshot() = *snapshot;
    // Snapshots of later steps belong to the abandoned run; workers drop
    // them when the new run's snapshots arrive.
    e.snapshot_holders.erase(e.snapshot_holders.upper_bound(snapshot->step()),
                             e.snapshot_holders.end());
  } else if (restart && !e.normalized.checkpoint().dir().empty()) {
    // Not past the published steps: the ones after them would be lost.
    assign.set_max_resume_step(e.job.steps_completed());
    // Every stage resumes from the newest checkpoint that verifies.
    assign.mutable_spec()->mutable_checkpoint()->set_resume("latest");
  }
  for (size_t k = 0; k < worker_ids.size(); ++k) {
    WorkerEntry& w = workers_.at(worker_ids[k]);
    w.job_id = job_id;
    w.stage = static_cast<int>(k);
    w.last_job = job_id;
    e.job.add_workers(w.id);
    assign.add_peer_addresses(w.caps.peer_address());
    *assign.add_placements() = PlacementOf(w.caps);
  }
  e.stage_done.assign(worker_ids.size(), 0);
  e.transport_reported.assign(worker_ids.size(), false);
  e.notes.clear();
  e.first_cancel_error.clear();
  e.pending_steps.clear();
  e.pending_failure.clear();
  e.failure_deadline = absl::InfiniteFuture();
  e.pending_recoverable = true;
  e.resume_steps.assign(worker_ids.size(), -1);
  e.adopting = false;
  e.assigned = absl::Now();
  e.recovery_reported = !restart;
  e.restored = absl::InfiniteFuture();
  e.progressed_early = false;
  rendezvous_.Open(job_id);
  TracesLocked(e);
  LogRingLocked(e);
  SetStateLocked(
      e, v1::RUNNING,
      !restart ? std::string()
      : snapshot.has_value()
          ? absl::StrCat(RestartLabel(e.job, e.max_restarts),
                         ": resuming from in-memory snapshots after step ",
                         snapshot->step())
          : absl::StrCat(RestartLabel(e.job, e.max_restarts),
                         ": resuming from the newest checkpoint that "
                         "verifies"));
  for (size_t k = 0; k < worker_ids.size(); ++k) {
    v1::ControllerMessage msg;
    *msg.mutable_assign() = assign;
    msg.mutable_assign()->set_stage(static_cast<int>(k));
    SendLocked(workers_.at(worker_ids[k]).link, std::move(msg));
  }
  LOG(INFO) << "job " << job_id << " started on " << worker_ids.size()
            << " worker(s)";
}

// ---- JobService.

absl::StatusOr<Job> JobManager::SubmitJob(const v1::SubmitJobRequest& request,
                                          const Caller& caller) {
  if (request.request_id().empty()) {
    return absl::InvalidArgumentError(
        "request_id: required (a client-chosen idempotency key)");
  }
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: ", request.request_id().size(),
                     " bytes, limit ", kMaxRequestIdBytes));
  }
  const std::string key = RequestKey(caller.user, request.request_id());
  // A job found under the key is returned only to its owner: an owner-less
  // job (from --insecure) whose request id was "alice:r1" has alice's key
  // for "r1" too.
  auto existing = [&](const Job& job) -> absl::StatusOr<Job> {
    if (job.owner() != caller.user) {
      return absl::AlreadyExistsError(
          "request_id: already used by another job; pick another one");
    }
    return job;
  };
  {
    absl::MutexLock lock(&mu_);
    auto it = job_by_request_.find(key);
    if (it != job_by_request_.end()) {
      return existing(jobs_.at(it->second)->job);
    }
  }
  absl::StatusOr<JobPlan> plan =
      PlanJob(request.spec(), ControllerPlanOptions(options_));
  // PlanJob's message already lists every problem with its field path.
  if (!plan.ok()) return plan.status();
  if (!options_.plugin_dir.empty()) {
    ASSIGN_OR_RETURN(const std::string config, TaskConfigJson(request.spec()));
    absl::StatusOr<ConfigCheck> check = ValidateTaskConfig(
        options_.plugin_dir, request.spec().task().plugin(), config);
    if (absl::IsNotFound(check.status())) {
      return absl::InvalidArgumentError(
          absl::StrCat("task.plugin: ", check.status().message()));
    }
    if (!check.ok()) return check.status();
  }
  Job result;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      return absl::UnavailableError("controller shutting down");
    }
    auto it = job_by_request_.find(key);
    if (it != job_by_request_.end()) {
      return existing(jobs_.at(it->second)->job);
    }
    Job job;
    job.set_request_id(request.request_id());
    job.set_owner(caller.user);
    *job.mutable_spec() = request.spec();
    job.set_priority(request.priority());
    job.set_create_time_ms(NowMs());
    ASSIGN_OR_RETURN(JobStore::Created created, store_->CreateJob(job));
    auto e = std::make_unique<JobEntry>();
    e->job = std::move(created.job);
    e->order = static_cast<int64_t>(jobs_.size()) + 1;  // jobs never leave
    SetPlanLocked(*e, *plan);
    const std::string id = e->job.job_id();
    job_by_request_[key] = id;
    jobs_[id] = std::move(e);
    if (created.created) {
      // The history starts with the QUEUED state, stored as event 0.
      LogLocked(*jobs_.at(id));
      queued_.insert(id);
    }
    ScheduleLocked();
    result = jobs_.at(id)->job;
  }
  Deliver();
  return result;
}

absl::StatusOr<JobManager::JobEntry*> JobManager::FindJobLocked(
    const std::string& job_id, const Caller& caller, const char* verb) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("job ", Quote(job_id), ": not found"));
  }
  if (!caller.admin && it->second->job.owner() != caller.user) {
    return absl::PermissionDeniedError(
        absl::StrCat("job ", job_id,
                     " belongs to another user: only its owner or an "
                     "admin may ",
                     verb, " it"));
  }
  return it->second.get();
}

absl::StatusOr<Job> JobManager::GetJob(const std::string& job_id,
                                       const Caller& caller) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobEntry * e, FindJobLocked(job_id, caller, "see"));
  Job job = e->job;
  job.set_tensorboard_dir(TensorboardDir(job_id));
  return job;
}

absl::StatusOr<v1::ListJobsResponse> JobManager::ListJobs(
    const v1::ListJobsRequest& request, const Caller& caller) {
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must be >= 0, got ", request.page_size()));
  }
  int limit = request.page_size() == 0
                  ? kDefaultPageSize
                  : std::min(request.page_size(), kMaxPageSize);
  int64_t before = 0;
  if (!request.page_token().empty()) {
    std::string decoded;
    if (!absl::WebSafeBase64Unescape(request.page_token(), &decoded) ||
        !absl::StartsWith(decoded, kTokenPrefix) ||
        !absl::SimpleAtoi(decoded.substr(sizeof(kTokenPrefix) - 1), &before) ||
        before <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_token: not a token from ListJobs: ",
                       Quote(request.page_token())));
    }
  }
  std::vector<JobState> states;
  for (int i = 0; i < request.states_size(); ++i) {
    JobState s = request.states(i);
    if (!v1::JobState_IsValid(s) || s == v1::JOB_STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("states[", i, "]: not a job state: ", int{s}));
    }
    states.push_back(s);
  }
  int64_t next_before = 0;
  ASSIGN_OR_RETURN(
      std::vector<Job> jobs,
      store_->ListJobs(states, caller.admin ? nullptr : &caller.user, limit,
                       before, &next_before));
  v1::ListJobsResponse response;
  size_t bytes = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    // A page stays well under the 4 MiB gRPC message limit whatever the
    // jobs hold; the next page starts at the first job left out.
    const size_t n = jobs[i].ByteSizeLong();
    int64_t seq = 0;
    if (i > 0 && bytes + n > kMaxListResponseBytes &&
        absl::SimpleAtoi(absl::StripPrefix(jobs[i].job_id(), "job-"), &seq)) {
      next_before = seq + 1;
      break;
    }
    bytes += n;
    jobs[i].set_tensorboard_dir(TensorboardDir(jobs[i].job_id()));
    *response.add_jobs() = std::move(jobs[i]);
  }
  if (next_before > 0) {
    response.set_next_page_token(
        absl::WebSafeBase64Escape(absl::StrCat(kTokenPrefix, next_before)));
  }
  return response;
}

absl::StatusOr<Job> JobManager::CancelJob(const v1::CancelJobRequest& request,
                                          const Caller& caller) {
  if (request.reason().size() > kMaxCancelReasonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("reason: ", request.reason().size(), " bytes, limit ",
                     kMaxCancelReasonBytes));
  }
  Job result;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(JobEntry * found,
                     FindJobLocked(request.job_id(), caller, "cancel"));
    JobEntry& e = *found;
    if (IsTerminal(e.job.state())) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", e.job.job_id(), " is already ",
                       v1::JobState_Name(e.job.state()),
                       "; only QUEUED, RUNNING or RECOVERING jobs "
                       "can be cancelled"));
    }
    if (shutting_down_) {
      return absl::UnavailableError("controller shutting down");
    }
    // Who asked is part of the record (on a --insecure controller nobody
    // is known).
    const std::string by = caller.user.empty()
                               ? std::string("cancelled by request")
                               : absl::StrCat("cancelled by ", caller.user);
    const std::string reason = request.reason().empty()
                                   ? by
                                   : absl::StrCat(by, ": ", request.reason());
    const bool running =
        e.job.state() == v1::RUNNING || e.job.state() == v1::RECOVERING;
    FinishJobLocked(e, v1::CANCELLED, reason, /*cancel_workers=*/running);
    ScheduleLocked();
    result = e.job;
  }
  Deliver();
  return result;
}

absl::StatusOr<std::shared_ptr<JobEventLog>> JobManager::WatchJob(
    const std::string& job_id, const Caller& caller) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobEntry * e, FindJobLocked(job_id, caller, "watch"));
  LogLocked(*e);
  return e->log;
}

absl::StatusOr<v1::GetTraceResponse> JobManager::GetTrace(
    const v1::GetTraceRequest& request, const Caller& caller) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step: must be >= 0 (0 = the newest), got ", request.step()));
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobEntry * e,
                   FindJobLocked(request.job_id(), caller, "see"));
  if (e->traces == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "job ", e->job.job_id(), ": no step traces held (",
        e->job.state() == v1::QUEUED
            ? std::string("it has not run yet")
            : absl::StrCat("the controller keeps them in memory for jobs "
                           "that have not ended and the ",
                           options_.keep_ended_jobs,
                           " that ended last, and not across its restarts"),
        ")"));
  }
  return e->traces->Get(e->job.job_id(), request.step());
}

absl::StatusOr<std::shared_ptr<LogRing>> JobManager::WatchLogs(
    const std::string& job_id, const Caller& caller) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobEntry * e, FindJobLocked(job_id, caller, "watch"));
  if (LogRingLocked(*e) == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "job ", job_id, " ended ", v1::JobState_Name(e->job.state()),
        " and its log lines are no longer kept (the controller keeps them "
        "in memory for jobs that have not ended and the ",
        options_.keep_ended_jobs,
        " that ended last, and not across its restarts)"));
  }
  return e->logs;
}

// ---- WorkerService.

absl::StatusOr<std::string> JobManager::RegisterWorker(
    const v1::RegisterWorker& reg, std::shared_ptr<WorkerLink> link) {
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      return absl::UnavailableError("controller shutting down");
    }
    // A reconnecting worker keeps its id unless a live worker holds it.
    int64_t n = 0;
    if (absl::StartsWith(reg.worker_id(), "w-") &&
        absl::SimpleAtoi(reg.worker_id().substr(2), &n) && n > 0 &&
        n < next_worker_ + kMaxWorkerIdAhead &&
        workers_.count(reg.worker_id()) == 0) {
      next_worker_ = std::max(next_worker_, n + 1);
    } else {
      n = next_worker_++;
    }
    id = absl::StrCat("w-", n);
    WorkerEntry& w = workers_[id];
    w.id = id;
    w.name = reg.name().empty() ? id : reg.name();
    w.caps = reg.capabilities();
    w.order = n;
    w.link = link;
    w.last_seen = absl::Now();
    v1::ControllerMessage msg;
    msg.mutable_registered()->set_worker_id(id);
    msg.mutable_registered()->set_heartbeat_interval_ms(
        absl::ToInt64Milliseconds(options_.heartbeat_interval));
    msg.mutable_registered()->set_heartbeat_timeout_ms(
        absl::ToInt64Milliseconds(options_.heartbeat_timeout));
    msg.mutable_registered()->set_adopt_timeout_ms(
        absl::ToInt64Milliseconds(options_.adopt_timeout));
    SendLocked(link, std::move(msg));
    LOG(INFO) << "worker " << WorkerLabel(id, w.name) << " registered, device "
              << w.caps.device() << ", peer " << w.caps.peer_address();
    if (!reg.running().job_id().empty()) ClaimStageLocked(w, reg.running());
    ScheduleLocked();
  }
  Deliver();
  return id;
}

void JobManager::OnWorkerMessage(const std::string& worker_id,
                                 const v1::WorkerMessage& msg,
                                 const WorkerLink* link) {
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(worker_id);
    if (it == workers_.end() || shutting_down_) return;
    if (link != nullptr && it->second.link.get() != link) return;
    WorkerEntry& w = it->second;
    w.last_seen = absl::Now();
    switch (msg.msg_case()) {
      case v1::WorkerMessage::kStep:
        HandleStepLocked(w, msg.step());
        break;
      case v1::WorkerMessage::kEval:
        HandleEvalLocked(w, msg.eval());
        break;
      case v1::WorkerMessage::kDone:
        HandleDoneLocked(w, msg.done());
        break;
      case v1::WorkerMessage::kTransport:
        HandleTransportLocked(w, msg.transport());
        break;
      case v1::WorkerMessage::kStarted:
        HandleStartedLocked(w, msg.started());
        break;
      case v1::WorkerMessage::kHeld:
        HandleHeldLocked(w, msg.held());
        break;
      case v1::WorkerMessage::kLog:
        HandleLogLocked(w, msg.log());
        break;
      case v1::WorkerMessage::kRendezvousPut:
        HandleRendezvousPutLocked(w, msg.rendezvous_put());
        break;
      case v1::WorkerMessage::kRendezvousGet:
        HandleRendezvousGetLocked(w, msg.rendezvous_get());
        break;
      case v1::WorkerMessage::kHeartbeat:
        if (msg.heartbeat().draining() && !w.draining) {
          w.draining = true;
          LOG(INFO) << "worker " << WorkerLabel(w.id, w.name)
                    << " is shutting down: no new stages for it";
        }
        break;
      default:
        break;  // a repeated register: liveness only
    }
  }
  Deliver();
}

void JobManager::OnWorkerStreamEnded(const std::string& worker_id,
                                     const std::string& why,
                                     const WorkerLink* link) {
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(worker_id);
    if (shutting_down_ || it == workers_.end()) return;
    if (link != nullptr && it->second.link.get() != link) return;
    LoseWorkerLocked(worker_id, why);
  }
  Deliver();
}

void JobManager::LoseWorkerLocked(const std::string& worker_id,
                                  const std::string& why) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  WorkerEntry w = std::move(it->second);
  workers_.erase(it);
  LOG(WARNING) << "worker " << WorkerLabel(w.id, w.name) << " lost: " << why;
  Outgoing out;
  out.link = w.link;
  out.close = true;
  out.status = absl::UnavailableError(
      absl::StrCat("worker ", w.id, " declared lost: ", why));
  outbox_.push_back(std::move(out));
  if (!w.job_id.empty()) {
    JobEntry& e = *jobs_.at(w.job_id);
    if (e.job.state() == v1::RUNNING) {
      GangBrokenLocked(
          e,
          absl::StrCat("worker ", WorkerLabel(w.id, w.name), " running ",
                       RankLabel(w.stage, e.num_stages, e.replicas),
                       " was lost: ", why),
          /*recoverable=*/true);
    } else if (e.job.state() == v1::RECOVERING) {
      e.draining.erase(w.id);
      MaybeRequeueLocked(e, absl::Now());
    }
  }
  ScheduleLocked();
}

JobManager::JobEntry* JobManager::RunningJobOfLocked(const WorkerEntry& w,
                                                     const std::string& job_id,
                                                     int stage) {
  if (w.job_id.empty() || w.job_id != job_id || w.stage != stage) {
    return nullptr;
  }
  JobEntry& e = *jobs_.at(job_id);
  return e.job.state() == v1::RUNNING ? &e : nullptr;
}

void JobManager::HandleStepLocked(WorkerEntry& w,
                                  const v1::StageStepReport& r) {
  JobEntry* e = RunningJobOfLocked(w, r.job_id(), r.stage());
  if (e == nullptr) return;
  const int64_t step = r.step().step();
  if (r.has_trace()) {
    // Also for steps already published: the stages' reports of one step
    // arrive on different streams, the loss stage's often first.
    v1::StageTrace trace = r.trace();
    trace.set_stage(r.stage());
    trace.set_worker_id(w.id);
    trace.set_worker_name(w.name);
    TracesLocked(*e)->AddStep(step, e->job.restarts(), std::move(trace));
  }
  if (r.stage() == e->loss_rank) RecordRecoveryLocked(*e, absl::Now());
  if (step <= e->job.steps_completed()) return;  // already published
  std::vector<v1::StageTiming>& timings = e->pending_steps[step];
  if (r.step().stages_size() == 0) {
    v1::StageTiming t;
    t.set_stage(r.stage());
    timings.push_back(t);
  }
  for (v1::StageTiming t : r.step().stages()) {
    t.set_stage(r.stage());
    timings.push_back(t);
  }
  if (r.stage() != e->loss_rank) return;
  JobEvent event;
  v1::StepMetrics* m = event.mutable_step();
  *m = r.step();
  m->clear_stages();
  std::sort(timings.begin(), timings.end(),
            [](const v1::StageTiming& a, const v1::StageTiming& b) {
              return a.stage() < b.stage();
            });
  for (const v1::StageTiming& t : timings) *m->add_stages() = t;
  e->pending_steps.erase(e->pending_steps.begin(),
                         e->pending_steps.upper_bound(step));
  e->job.set_steps_completed(step);
  *e->job.mutable_last_step() = *m;
  CommitLocked(*e, &event);
  WriteTensorboardLocked(*e, event);
}

void JobManager::HandleEvalLocked(WorkerEntry& w,
                                  const v1::StageEvalReport& r) {
  JobEntry* e = RunningJobOfLocked(w, r.job_id(), r.stage());
  if (e == nullptr) return;
  if (r.has_trace()) {
    v1::StageTrace trace = r.trace();
    trace.set_stage(r.stage());
    TracesLocked(*e)->AddEval(r.eval().step(), e->job.restarts(), trace);
  }
  // Every stage reports its evals (for their spans); the metrics are the
  // loss stage's.
  if (r.stage() != e->loss_rank) return;
  // A restarted gang recomputes evals it has already published.
  if (e->job.has_last_eval() && r.eval().step() <= e->job.last_eval().step()) {
    return;
  }
  JobEvent event;
  *event.mutable_eval() = r.eval();
  *e->job.mutable_last_eval() = r.eval();
  CommitLocked(*e, &event);
  WriteTensorboardLocked(*e, event);
}

void JobManager::HandleDoneLocked(WorkerEntry& w, const v1::StageDone& d) {
  if (!w.stale_job.empty() && w.stale_job == d.job_id() && w.job_id.empty()) {
    // The stage of a refused claim has ended: the worker is free.
    w.stale_job.clear();
    ScheduleLocked();
    return;
  }
  if (!w.job_id.empty() && w.job_id == d.job_id() && w.stage == d.stage()) {
    JobEntry& old = *jobs_.at(w.job_id);
    if (old.job.state() == v1::RECOVERING) {
      // A stage of the old gang has stopped.
      w.job_id.clear();
      w.stage = -1;
      old.draining.erase(w.id);
      MaybeRequeueLocked(old, absl::Now());
      ScheduleLocked();
      return;
    }
  }
  JobEntry* e = RunningJobOfLocked(w, d.job_id(), d.stage());
  if (e == nullptr) return;
  const std::string label = WorkerLabel(w.id, w.name);
  if (!d.ok()) {
    std::string error = absl::StrCat(
        "stage ", d.stage(), " on worker ", label, " failed: ",
        d.error().empty() ? std::string("no error given") : d.error());
    if (!d.cancelled() && e->pending_failure.empty()) {
      e->pending_failure = error;
      e->pending_recoverable = IsRecoverableStageFailure(
          d.code() > 0 && d.code() <= 16
              ? static_cast<absl::StatusCode>(d.code())
              : absl::StatusCode::kUnknown);
      e->failure_deadline = absl::Now() + FailureGrace();
      // Stop the other stages now; they report back as cancelled.
      for (auto& [id, other] : workers_) {
        if (other.job_id != e->job.job_id() || other.id == w.id) continue;
        v1::ControllerMessage msg;
        msg.mutable_cancel()->set_job_id(e->job.job_id());
        msg.mutable_cancel()->set_reason(error);
        SendLocked(other.link, std::move(msg));
      }
    }
    if (e->first_cancel_error.empty()) e->first_cancel_error = error;
  }
  if (d.ok()) RecordRecoveryLocked(*e, absl::Now());  // ended without a step
  e->stage_done[d.stage()] = d.ok() ? 1 : 2;
  w.job_id.clear();
  w.stage = -1;
  bool all_done = true;
  bool all_ok = true;
  for (int s : e->stage_done) {
    all_done = all_done && s != 0;
    all_ok = all_ok && s == 1;
  }
  if (all_done) {
    if (all_ok) {
      FinishJobLocked(
          *e, v1::SUCCEEDED,
          absl::StrCat("all ", e->num_stages, " stage(s) finished after step ",
                       e->job.steps_completed()),
          false);
    } else {
      GangBrokenLocked(*e,
                       e->pending_failure.empty() ? e->first_cancel_error
                                                  : e->pending_failure,
                       e->pending_recoverable);
    }
  }
  ScheduleLocked();
}

void JobManager::HandleTransportLocked(WorkerEntry& w,
                                       const v1::StageTransport& t) {
  JobEntry* e = RunningJobOfLocked(w, t.job_id(), t.stage());
  if (e == nullptr || t.stage() < 0 ||
      t.stage() >= static_cast<int>(e->transport_reported.size()) ||
      e->transport_reported[t.stage()]) {
    return;
  }
  e->transport_reported[t.stage()] = true;
  // Every rank decides from the same placements, so normally only stage
  // 0's note is new; a differing one is kept (it explains a failure).
  NoteLocked(
      *e, t.stage(),
      absl::StrCat("transport: ", t.reason().empty() ? t.kind() : t.reason()));
}

void JobManager::HandleLogLocked(WorkerEntry& w, const v1::StageLogLine& l) {
  // Only a stage the controller counts this worker in (running, or
  // draining for a restart): a line about anything else is not the job's.
  if (w.job_id.empty() || w.job_id != l.job_id() || w.stage != l.stage()) {
    return;
  }
  JobEntry& e = *jobs_.at(w.job_id);
  LogRing* ring = LogRingLocked(e);
  if (ring == nullptr) return;
  const absl::Time now = absl::Now();
  if (w.log_refilled == absl::InfinitePast()) {
    w.log_tokens = options_.log_burst;
  } else {
    w.log_tokens = std::min(
        options_.log_burst,
        w.log_tokens + options_.log_lines_per_second *
                           absl::ToDoubleSeconds(now - w.log_refilled));
  }
  w.log_refilled = now;
  if (w.log_tokens < 1) {
    ++w.logs_dropped;
    return;
  }
  w.log_tokens -= 1;
  v1::LogLine line;
  line.set_stage(l.stage());
  line.set_worker_id(w.id);
  line.set_worker_name(w.name);
  if (w.logs_dropped > 0) {
    line.set_time_ms(NowMs());
    line.set_severity(v1::LOG_SEVERITY_WARNING);
    line.set_text(
        absl::StrCat("(controller) ", w.logs_dropped, " line(s) from worker ",
                     WorkerLabel(w.id, w.name), " dropped: more than ",
                     options_.log_lines_per_second, " lines/s"));
    ring->Append(line);
    w.logs_dropped = 0;
  }
  line.set_time_ms(l.time_ms());
  line.set_severity(v1::LogSeverity_IsValid(l.severity())
                        ? l.severity()
                        : v1::LOG_SEVERITY_ERROR);
  // Cut before the copy: the text may be as long as a gRPC message.
  line.set_text(CutUtf8(l.text(), options_.log_limits.max_line_bytes));
  ring->Append(std::move(line));
}

void JobManager::NoteLocked(JobEntry& e, int stage, std::string text) {
  if (text.size() > kMaxNoteBytes) text.resize(kMaxNoteBytes);
  if (!e.notes.insert(text).second) return;
  LOG(INFO) << "job " << e.job.job_id() << " stage " << stage << ": " << text;
  JobEvent event;
  v1::JobNote* note = event.mutable_note();
  note->set_stage(stage);
  note->set_step(e.job.steps_completed());
  note->set_text(std::move(text));
  CommitLocked(e, &event);
}

void JobManager::HandleStartedLocked(WorkerEntry& w,
                                     const v1::StageStarted& started) {
  JobEntry* e = RunningJobOfLocked(w, started.job_id(), started.stage());
  if (e == nullptr || started.stage() < 0 ||
      started.stage() >= static_cast<int>(e->resume_steps.size())) {
    return;
  }
  e->resume_steps[started.stage()] = started.resume_step();
  if (e->recovery_reported || e->restored != absl::InfiniteFuture()) return;
  for (int64_t r : e->resume_steps) {
    if (r < 0) return;
  }
  // Every stage of the restarted gang has restored its state (they agree
  // on the step: RunStage checks that before the first step). Snapshots of
  // later steps belong to the abandoned run (no new step is done yet).
  e->restored = absl::Now();
  e->snapshot_holders.erase(e->snapshot_holders.upper_bound(e->resume_steps[0]),
                            e->snapshot_holders.end());
  if (e->progressed_early) RecordRecoveryLocked(*e, e->restored);
}

void JobManager::RecordRecoveryLocked(JobEntry& e_ref, absl::Time now) {
  JobEntry* e = &e_ref;
  if (e->recovery_reported) return;
  if (e->restored == absl::InfiniteFuture()) {
    // Recorded when the last StageStarted arrives.
    e->progressed_early = true;
    return;
  }
  e->recovery_reported = true;
  JobEvent event;
  v1::JobRecovery* r = event.mutable_recovery();
  r->set_attempt(e->job.restarts());
  if (!e->job.restart_reasons().empty()) {
    r->set_cause(*e->job.restart_reasons().rbegin());
  }
  r->set_resume_step(e->resume_steps[0]);
  r->set_detected_step(e->detected_step);
  r->set_reschedule_s(absl::ToDoubleSeconds(e->assigned - e->detected));
  r->set_restore_s(absl::ToDoubleSeconds(e->restored - e->assigned));
  r->set_warmup_s(absl::ToDoubleSeconds(now - e->restored));
  r->set_detected_ms(absl::ToUnixMillis(e->detected));
  *r->mutable_workers() = e->job.workers();
  r->set_step(e->job.steps_completed());
  r->set_from_snapshot(e->from_snapshot);
  LOG(INFO) << "job " << e->job.job_id() << " "
            << RestartLabel(e->job, e->max_restarts) << ": resumed after step "
            << r->resume_step() << " (the loss "
            << "was noticed after step " << r->detected_step() << "), "
            << r->reschedule_s() << " s to reschedule, " << r->restore_s()
            << " s to restore, " << r->warmup_s()
            << " s to the first step after it";
  CommitLocked(*e, &event);
}

void JobManager::HandleHeldLocked(WorkerEntry& w, const v1::StateHeld& held) {
  if (w.job_id.empty() || w.job_id != held.job_id()) return;
  JobEntry& e = *jobs_.at(w.job_id);
  // Also while the old gang drains: a copy that arrived just before the
  // cancel is still a state to resume from.
  if (e.job.state() != v1::RUNNING && e.job.state() != v1::RECOVERING) return;
  if (held.stage() == -1) {
    e.newest_checkpoint = std::max(e.newest_checkpoint, held.step());
    return;
  }
  if (held.stage() < 0 || held.stage() >= e.num_stages || held.step() <= 0) {
    return;
  }
  auto& per_stage = e.snapshot_holders[held.step()];
  per_stage.resize(e.num_stages);
  per_stage[held.stage()].insert(w.id);
  // Workers keep two steps per stage; a few more here cover stages that
  // are a step apart.
  while (e.snapshot_holders.size() > 4) {
    e.snapshot_holders.erase(e.snapshot_holders.begin());
  }
}

bool JobManager::HoldsSnapshotsOfLocked(const std::string& id,
                                        const std::string& job_id) {
  auto it = workers_.find(id);
  return it != workers_.end() && it->second.last_job == job_id;
}

std::optional<v1::SnapshotResume> JobManager::ChooseSnapshotLocked(
    const JobEntry& e, const std::vector<std::string>& gang) {
  for (auto it = e.snapshot_holders.rbegin(); it != e.snapshot_holders.rend();
       ++it) {
    const int64_t step = it->first;
    // Never past the published steps: the ones after them would be lost.
    if (step > e.job.steps_completed()) continue;
    if (step <= e.newest_checkpoint) break;
    v1::SnapshotResume resume;
    resume.set_step(step);
    for (int k = 0; k < e.num_stages; ++k) {
      int source = -1;
      for (size_t r = 0; r < gang.size(); ++r) {
        if (it->second[k].count(gang[r]) == 0 ||
            !HoldsSnapshotsOfLocked(gang[r], e.job.job_id())) {
          continue;
        }
        // The stage's own worker first: no transfer.
        if (source < 0 || static_cast<int>(r) == k) {
          source = static_cast<int>(r);
        }
      }
      if (source < 0) break;
      resume.add_source_ranks(source);
    }
    if (resume.source_ranks_size() == e.num_stages) return resume;
  }
  return std::nullopt;
}

void JobManager::GangBrokenLocked(JobEntry& e, std::string cause,
                                  bool recoverable) {
  if (recoverable && e.job.restarts() < e.max_restarts) {
    BeginRecoveryLocked(e, cause);
    return;
  }
  std::string reason = cause;
  if (!recoverable && e.max_restarts > 0) {
    reason = absl::StrCat(cause,
                          " (not restarted: a restart would fail the "
                          "same way)");
  } else if (e.max_restarts > 0) {
    std::vector<std::string> history;
    for (int k = 0; k < e.job.restart_reasons_size(); ++k) {
      history.push_back(absl::StrCat("restart ", k + 1,
                                     " after: ", e.job.restart_reasons(k)));
    }
    reason =
        absl::StrCat("gave up after ", e.job.restarts(),
                     " restart(s) (recovery.max_restarts = ", e.max_restarts,
                     "): ", absl::StrJoin(history, "; "), "; then: ", cause);
  }
  FinishJobLocked(e, v1::FAILED, reason, /*cancel_workers=*/true);
}

void JobManager::BeginRecoveryLocked(JobEntry& e, std::string cause) {
  const absl::Time now = absl::Now();
  const std::string& job_id = e.job.job_id();
  if (e.from_snapshot && e.restored == absl::InfiniteFuture()) {
    // The last restart from snapshots broke before every stage restored:
    // later restarts read the checkpoint folder.
    e.snapshots_failed = true;
  }
  e.job.set_restarts(e.job.restarts() + 1);
  e.job.add_restart_reasons(cause);
  e.detected = now;
  e.detected_step = e.job.steps_completed();
  e.draining.clear();
  for (auto& [id, w] : workers_) {
    if (w.job_id != job_id) continue;
    if (w.stage >= 0 && w.stage < static_cast<int>(e.stage_done.size()) &&
        e.stage_done[w.stage] == 0) {
      // Still running (or stuck on its lost neighbour): stop it, and wait
      // for its end before the checkpoint folder is read again.
      v1::ControllerMessage msg;
      msg.mutable_cancel()->set_job_id(job_id);
      msg.mutable_cancel()->set_reason(
          absl::StrCat("restarting job ", job_id, ": ", cause));
      SendLocked(w.link, std::move(msg));
      e.draining.insert(id);
    } else {
      w.job_id.clear();
      w.stage = -1;
    }
  }
  e.pending_steps.clear();
  e.pending_failure.clear();
  e.failure_deadline = absl::InfiniteFuture();
  e.adopting = false;
  e.drain_deadline = now + options_.drain_timeout;
  const int k = e.job.restarts();
  const int64_t backoff_ms =
      k <= 1 ? 0
             : std::min<int64_t>(kMaxRestartBackoffMs,
                                 e.backoff_ms << std::min(k - 2, 20));
  e.restart_not_before = now + absl::Milliseconds(backoff_ms);
  SendRendezvousRepliesLocked(rendezvous_.Close(
      job_id, absl::AbortedError(absl::StrCat("rendezvous of job ", job_id,
                                              ": closed, the job is "
                                              "restarting: ",
                                              cause))));
  LOG(WARNING) << "job " << job_id << " " << RestartLabel(e.job, e.max_restarts)
               << " after step " << e.detected_step << ": " << cause
               << "; stopping " << e.draining.size() << " stage(s), backoff "
               << backoff_ms << " ms";
  SetStateLocked(
      e, v1::RECOVERING,
      absl::StrCat(RestartLabel(e.job, e.max_restarts), " after: ", cause));
  MaybeRequeueLocked(e, now);
}

void JobManager::MaybeRequeueLocked(JobEntry& e, absl::Time now) {
  if (e.job.state() != v1::RECOVERING || !e.draining.empty() ||
      now < e.restart_not_before) {
    return;
  }
  queued_.insert(e.job.job_id());
}

void JobManager::ClaimStageLocked(WorkerEntry& w, const v1::StageClaim& claim) {
  auto it = jobs_.find(claim.job_id());
  std::string refusal;
  if (it == jobs_.end()) {
    refusal = "no such job";
  } else {
    JobEntry& e = *it->second;
    const int k = claim.stage();
    if (IsTerminal(e.job.state())) {
      refusal = absl::StrCat("the job is ", v1::JobState_Name(e.job.state()));
    } else if (!e.adopting || e.job.state() != v1::RUNNING) {
      refusal = absl::StrCat("the job is ", v1::JobState_Name(e.job.state()),
                             " and not waiting for its stages to be "
                             "reclaimed");
    } else if (claim.attempt() != e.job.restarts()) {
      refusal = absl::StrCat("the claim is for attempt ", claim.attempt(),
                             ", the job is at attempt ", e.job.restarts());
    } else if (k < 0 || k >= e.num_stages || e.claimed[k]) {
      refusal = absl::StrCat("stage ", k, " is not free to reclaim");
    } else {
      e.claimed[k] = true;
      w.job_id = e.job.job_id();
      w.stage = k;
      w.last_job = e.job.job_id();
      while (e.job.workers_size() < e.num_stages) e.job.add_workers("");
      e.job.set_workers(k, w.id);
      LOG(INFO) << "job " << e.job.job_id() << ": worker "
                << WorkerLabel(w.id, w.name) << " reclaimed stage " << k;
      bool all = true;
      for (bool c : e.claimed) all = all && c;
      if (all) {
        e.adopting = false;
        e.adopt_deadline = absl::InfiniteFuture();
        NoteLocked(e, k,
                   absl::StrCat("controller restarted: every stage was "
                                "reclaimed by its worker; the job ran on "
                                "(steps completed while it was away are "
                                "published as they arrive)"));
      } else {
        CommitLocked(e, nullptr);
      }
      return;
    }
  }
  LOG(INFO) << "worker " << WorkerLabel(w.id, w.name) << " claims stage "
            << claim.stage() << " of job " << claim.job_id() << " (attempt "
            << claim.attempt() << "): refused, " << refusal;
  if (it != jobs_.end() && it->second->job.state() == v1::RECOVERING &&
      it->second->draining.count(w.id) > 0) {
    // A stage of the old gang the restart waits for: attached as
    // draining, so that its end lets the restart go on.
    w.job_id = claim.job_id();
    w.stage = claim.stage();
  } else {
    w.stale_job = claim.job_id();
  }
  v1::ControllerMessage msg;
  msg.mutable_cancel()->set_job_id(claim.job_id());
  msg.mutable_cancel()->set_reason(
      absl::StrCat("the controller does not run stage ", claim.stage(),
                   " of job ", claim.job_id(), " (attempt ", claim.attempt(),
                   ") on this worker: ", refusal));
  SendLocked(w.link, std::move(msg));
}

absl::Status JobManager::CheckRendezvousCallerLocked(
    const WorkerEntry& w, const std::string& job_id) {
  if (job_id.empty()) {
    return absl::InvalidArgumentError("rendezvous: job_id is empty");
  }
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("rendezvous of job ", job_id, ": no such job"));
  }
  const Job& job = it->second->job;
  if (job.state() != v1::RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("rendezvous of job ", job_id, ": the job is ",
                     v1::JobState_Name(job.state()), ", not RUNNING",
                     job.reason().empty() ? "" : ": ", job.reason()));
  }
  if (w.job_id != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("rendezvous of job ", job_id, ": worker ",
                     WorkerLabel(w.id, w.name), " runs no stage of it"));
  }
  return absl::OkStatus();
}

void JobManager::HandleRendezvousPutLocked(WorkerEntry& w,
                                           const v1::RendezvousPut& put) {
  absl::Status allowed = CheckRendezvousCallerLocked(w, put.job_id());
  if (!allowed.ok()) {
    SendLocked(w.link, RendezvousRefusal(put.request_id(), allowed));
    return;
  }
  SendRendezvousRepliesLocked(rendezvous_.Put(w.id, put));
}

void JobManager::HandleRendezvousGetLocked(WorkerEntry& w,
                                           const v1::RendezvousGet& get) {
  absl::Status allowed = CheckRendezvousCallerLocked(w, get.job_id());
  if (!allowed.ok()) {
    SendLocked(w.link, RendezvousRefusal(get.request_id(), allowed));
    return;
  }
  SendRendezvousRepliesLocked(rendezvous_.Get(w.id, get, absl::Now()));
}

void JobManager::SendRendezvousRepliesLocked(
    std::vector<RendezvousTable::Reply> replies) {
  for (RendezvousTable::Reply& r : replies) {
    auto it = workers_.find(r.worker_id);
    if (it == workers_.end()) continue;  // lost; its stream is closed
    v1::ControllerMessage msg;
    *msg.mutable_rendezvous_reply() = std::move(r.reply);
    SendLocked(it->second.link, std::move(msg));
  }
}

absl::Duration JobManager::FailureGrace() const {
  return std::min(options_.heartbeat_timeout, absl::Seconds(1));
}

void JobManager::SettleFailuresLocked(absl::Time now) {
  const size_t queued_before = queued_.size();
  bool changed = false;
  for (auto& [id, entry] : jobs_) {
    JobEntry& e = *entry;
    if (e.job.state() == v1::RECOVERING) {
      if (!e.draining.empty() && now >= e.drain_deadline) {
        // A stage that ignores its cancel (stuck in a kernel, say) must not
        // hold the restart up: its worker is dropped, and when it
        // reconnects its claim is refused and it stays out of gangs until
        // that stage ends.
        const std::vector<std::string> stuck(e.draining.begin(),
                                             e.draining.end());
        for (const std::string& w : stuck) {
          if (workers_.count(w) == 0) {
            // Never came back (after a controller restart): it has stopped
            // its stage by itself (WorkerRegistered.adopt_timeout_ms).
            e.draining.erase(w);
            continue;
          }
          LoseWorkerLocked(
              w, absl::StrCat("its stage of job ", e.job.job_id(),
                              " did not stop within ",
                              absl::FormatDuration(options_.drain_timeout),
                              " of the cancel"));
        }
        changed = true;
      }
      MaybeRequeueLocked(e, now);
      continue;
    }
    if (e.job.state() != v1::RUNNING) continue;
    if (e.adopting && now >= e.adopt_deadline) {
      std::vector<std::string> missing;
      for (int k = 0; k < e.num_stages; ++k) {
        if (!e.claimed[k]) missing.push_back(absl::StrCat(k));
      }
      GangBrokenLocked(
          e,
          absl::StrCat("the controller restarted and stage(s) ",
                       absl::StrJoin(missing, ", "),
                       " were not reclaimed by their workers within ",
                       absl::FormatDuration(options_.adopt_timeout)),
          /*recoverable=*/true);
      changed = true;
      continue;
    }
    if (e.pending_failure.empty() || now < e.failure_deadline) continue;
    GangBrokenLocked(e, e.pending_failure, e.pending_recoverable);
    changed = true;
  }
  if (changed || queued_.size() != queued_before) ScheduleLocked();
}

JobManager::Stats JobManager::GetStats() {
  absl::MutexLock lock(&mu_);
  Stats s;
  for (int i = v1::JobState_MIN; i <= v1::JobState_MAX; ++i) {
    if (v1::JobState_IsValid(i) && i != v1::JOB_STATE_UNSPECIFIED) {
      s.jobs[static_cast<v1::JobState>(i)] = 0;
    }
  }
  for (const auto& [id, e] : jobs_) {
    ++s.jobs[e->job.state()];
    s.restarts += e->job.restarts();
  }
  s.queued = static_cast<int64_t>(queued_.size());
  for (const auto& [id, w] : workers_) {
    const std::string device =
        w.caps.device().empty() ? "cpu" : w.caps.device();
    ++s.workers[{device,
                 w.job_id.empty() && w.stale_job.empty() ? "idle" : "busy"}];
  }
  return s;
}

std::vector<JobManager::WorkerInfo> JobManager::ListWorkers() {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<int64_t, WorkerInfo>> infos;
  for (const auto& [id, w] : workers_) {
    infos.push_back({w.order,
                     {w.id, w.name, w.caps.device(), w.job_id, w.stage, w.caps,
                      absl::Now() - w.last_seen}});
  }
  std::sort(infos.begin(), infos.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<WorkerInfo> out;
  for (auto& [order, info] : infos) out.push_back(std::move(info));
  return out;
}

}  // namespace trainyard
