#include "controller/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace trainyard {
namespace {

// A reconnecting worker may keep an id up to this far beyond the newest one
// given out (ids stay small, and the counter cannot overflow).
constexpr int64_t kMaxWorkerIdAhead = 1000000;

v1::ControllerMessage RendezvousRefusal(int64_t request_id,
                                        const absl::Status& why) {
  v1::ControllerMessage msg;
  v1::RendezvousReply* reply = msg.mutable_rendezvous_reply();
  reply->set_request_id(request_id);
  reply->set_code(static_cast<int32_t>(why.code()));
  reply->set_error(std::string(why.message()));
  return msg;
}

}  // namespace

absl::StatusOr<std::string> WorkerRegistry::RegisterWorker(
    const v1::RegisterWorker& reg, std::shared_ptr<WorkerLink> link) {
  std::string id;
  {
    absl::MutexLock lock(&s_.mu);
    if (s_.shutting_down) {
      return absl::UnavailableError("controller shutting down");
    }
    const int64_t n = WorkerNumberLocked(reg.worker_id());
    id = absl::StrCat("w-", n);
    WorkerEntry& w = s_.workers[id];
    w.id = id;
    w.name = reg.name().empty() ? id : reg.name();
    w.caps = reg.capabilities();
    w.register_order = n;
    w.link = link;
    w.last_seen = absl::Now();
    const JobManagerOptions& options = s_.options;
    v1::ControllerMessage msg;
    v1::WorkerRegistered* registered = msg.mutable_registered();
    registered->set_worker_id(id);
    registered->set_heartbeat_interval_ms(
        absl::ToInt64Milliseconds(options.heartbeat_interval));
    registered->set_heartbeat_timeout_ms(
        absl::ToInt64Milliseconds(options.heartbeat_timeout));
    registered->set_adopt_timeout_ms(
        absl::ToInt64Milliseconds(options.adopt_timeout));
    s_.outbox.SendLocked(link, std::move(msg));
    LOG(INFO) << "worker " << WorkerLabel(w) << " registered, device "
              << w.caps.device() << ", peer " << w.caps.peer_address();
    if (!reg.running().job_id().empty()) {
      adoption_.ClaimStageLocked(w, reg.running());
    }
    gangs_.ScheduleLocked();
  }
  s_.outbox.Deliver();
  return id;
}

int64_t WorkerRegistry::WorkerNumberLocked(const std::string& requested) {
  // A reconnecting worker keeps its id unless a live worker holds it.
  int64_t n = 0;
  if (absl::StartsWith(requested, "w-") &&
      absl::SimpleAtoi(requested.substr(2), &n) && n > 0 &&
      n < s_.next_worker + kMaxWorkerIdAhead &&
      s_.workers.count(requested) == 0) {
    s_.next_worker = std::max(s_.next_worker, n + 1);
    return n;
  }
  return s_.next_worker++;
}

void WorkerRegistry::OnWorkerMessage(const std::string& worker_id,
                                     const v1::WorkerMessage& msg,
                                     const WorkerLink* link) {
  {
    absl::MutexLock lock(&s_.mu);
    auto it = s_.workers.find(worker_id);
    if (it == s_.workers.end() || s_.shutting_down) return;
    if (link != nullptr && it->second.link.get() != link) return;
    it->second.last_seen = absl::Now();
    DispatchLocked(it->second, msg);
  }
  s_.outbox.Deliver();
}

void WorkerRegistry::DispatchLocked(WorkerEntry& w,
                                    const v1::WorkerMessage& msg) {
  switch (msg.msg_case()) {
    case v1::WorkerMessage::kStep:
      reports_.HandleStepLocked(w, msg.step());
      break;
    case v1::WorkerMessage::kEval:
      reports_.HandleEvalLocked(w, msg.eval());
      break;
    case v1::WorkerMessage::kDone:
      reports_.HandleDoneLocked(w, msg.done());
      break;
    case v1::WorkerMessage::kTransport:
      reports_.HandleTransportLocked(w, msg.transport());
      break;
    case v1::WorkerMessage::kStarted:
      reports_.HandleStartedLocked(w, msg.started());
      break;
    case v1::WorkerMessage::kHeld:
      reports_.HandleHeldLocked(w, msg.held());
      break;
    case v1::WorkerMessage::kShard:
      reports_.HandleShardLocked(w, msg.shard());
      break;
    case v1::WorkerMessage::kLog:
      telemetry_.TakeLogLineLocked(w, msg.log());
      break;
    case v1::WorkerMessage::kRendezvousPut:
      HandleRendezvousPutLocked(w, msg.rendezvous_put());
      break;
    case v1::WorkerMessage::kRendezvousGet:
      HandleRendezvousGetLocked(w, msg.rendezvous_get());
      break;
    case v1::WorkerMessage::kHeartbeat:
      if (msg.heartbeat().draining() && !w.shutting_down) {
        w.shutting_down = true;
        LOG(INFO) << "worker " << WorkerLabel(w)
                  << " is shutting down: no new stages for it";
      }
      break;
    default:
      break;  // a repeated register: liveness only
  }
}

void WorkerRegistry::OnWorkerStreamEnded(const std::string& worker_id,
                                         const std::string& why,
                                         const WorkerLink* link) {
  {
    absl::MutexLock lock(&s_.mu);
    auto it = s_.workers.find(worker_id);
    if (s_.shutting_down || it == s_.workers.end()) return;
    if (link != nullptr && it->second.link.get() != link) return;
    liveness_.LoseWorkerLocked(worker_id, why);
  }
  s_.outbox.Deliver();
}

std::vector<WorkerInfo> WorkerRegistry::ListWorkers() {
  absl::MutexLock lock(&s_.mu);
  std::vector<std::pair<int64_t, WorkerInfo>> infos;
  for (const auto& [id, w] : s_.workers) {
    infos.push_back({w.register_order,
                     {w.id, w.name, w.caps.device(), w.job_id, w.rank, w.caps,
                      absl::Now() - w.last_seen}});
  }
  std::sort(infos.begin(), infos.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<WorkerInfo> out;
  for (auto& [order, info] : infos) out.push_back(std::move(info));
  return out;
}

absl::Status WorkerRegistry::CheckRendezvousCallerLocked(
    const WorkerEntry& w, const std::string& job_id) {
  if (job_id.empty()) {
    return absl::InvalidArgumentError("rendezvous: job_id is empty");
  }
  auto it = s_.jobs.find(job_id);
  if (it == s_.jobs.end()) {
    return absl::NotFoundError(
        absl::StrCat("rendezvous of job ", job_id, ": no such job"));
  }
  const v1::Job& job = it->second->job;
  if (job.state() != v1::RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("rendezvous of job ", job_id, ": the job is ",
                     v1::JobState_Name(job.state()), ", not RUNNING",
                     job.reason().empty() ? "" : ": ", job.reason()));
  }
  if (w.job_id != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("rendezvous of job ", job_id, ": worker ", WorkerLabel(w),
                     " runs no stage of it"));
  }
  return absl::OkStatus();
}

void WorkerRegistry::HandleRendezvousPutLocked(WorkerEntry& w,
                                               const v1::RendezvousPut& put) {
  absl::Status allowed = CheckRendezvousCallerLocked(w, put.job_id());
  if (!allowed.ok()) {
    s_.outbox.SendLocked(w.link, RendezvousRefusal(put.request_id(), allowed));
    return;
  }
  SendRendezvousRepliesLocked(s_, s_.rendezvous.Put(w.id, put));
}

void WorkerRegistry::HandleRendezvousGetLocked(WorkerEntry& w,
                                               const v1::RendezvousGet& get) {
  absl::Status allowed = CheckRendezvousCallerLocked(w, get.job_id());
  if (!allowed.ok()) {
    s_.outbox.SendLocked(w.link, RendezvousRefusal(get.request_id(), allowed));
    return;
  }
  SendRendezvousRepliesLocked(s_, s_.rendezvous.Get(w.id, get, absl::Now()));
}

}  // namespace trainyard
