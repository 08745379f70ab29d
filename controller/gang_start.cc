#include "controller/gang_start.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/sha256.h"
#include "glog/logging.h"
#include "net/address.h"

namespace trainyard {
namespace {

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

// For a restart on `chosen`, when the gang keeps its size: workers of the
// last gang (`job.workers()`) keep their ranks, since their snapshots are
// local and only the lost ranks' state moves; the other chosen workers
// fill the ranks left, in order.
std::vector<std::string> KeepRanks(const v1::Job& job,
                                   const std::vector<std::string>& chosen) {
  if (job.workers_size() != static_cast<int>(chosen.size())) return chosen;
  std::vector<std::string> placed(chosen.size());
  std::set<std::string> rest(chosen.begin(), chosen.end());
  for (size_t k = 0; k < chosen.size(); ++k) {
    if (rest.erase(job.workers(k)) > 0) placed[k] = job.workers(k);
  }
  auto next = rest.begin();
  for (std::string& id : placed) {
    if (id.empty()) id = *next++;
  }
  return placed;
}

// e's StageAssignment, less the per-rank parts: what a restarted gang
// resumes from (`snapshot`, else the newest checkpoint that verifies).
v1::StageAssignment NewAssignment(
    JobEntry& e, const std::optional<v1::SnapshotResume>& snapshot,
    bool restart) {
  v1::StageAssignment assign;
  assign.set_job_id(e.job.job_id());
  *assign.mutable_spec() = e.worker_spec;
  assign.set_attempt(e.job.restarts());
  assign.set_data_plane_secret(RandomBytes(32));
  e.from_snapshot = snapshot.has_value();
  if (snapshot.has_value()) {
    *assign.mutable_snapshot() = *snapshot;
    // Snapshots of later steps belong to the abandoned run; workers drop
    // them when the new run's snapshots arrive.
    e.snapshot_holders.erase(e.snapshot_holders.upper_bound(snapshot->step()),
                             e.snapshot_holders.end());
  } else if (restart && !e.worker_spec.checkpoint().dir().empty()) {
    // Not past the published steps: the ones after them would be lost.
    assign.set_max_resume_step(e.job.steps_completed());
    // Every rank resumes from the newest checkpoint that verifies.
    assign.mutable_spec()->mutable_checkpoint()->set_resume("latest");
  }
  return assign;
}

// Forgets what the last gang of e reported, for a new gang of `ranks`.
void ResetForNewGang(JobEntry& e, size_t ranks, bool restart) {
  e.rank_ends.assign(ranks, RankEnd::kRunning);
  e.transport_reported.assign(ranks, false);
  e.notes.clear();
  e.first_cancel_error.clear();
  e.pending_steps.clear();
  e.pending_failure.clear();
  e.failure_deadline = absl::InfiniteFuture();
  e.pending_recoverable = true;
  e.resume_steps.assign(ranks, -1);
  e.adopting = false;
  e.gang_assigned = absl::Now();
  e.recovery_reported = !restart;
  e.gang_restored = absl::InfiniteFuture();
  e.progressed_early = false;
}

// The reason a job starting RUNNING records.
std::string StartReason(const JobEntry& e,
                        const std::optional<v1::SnapshotResume>& snapshot,
                        bool restart) {
  if (!restart) return std::string();
  if (snapshot.has_value()) {
    return absl::StrCat(RestartLabel(e),
                        ": resuming from in-memory snapshots after step ",
                        snapshot->step());
  }
  return absl::StrCat(RestartLabel(e),
                      ": resuming from the newest checkpoint that verifies");
}

}  // namespace

void GangStarter::ScheduleLocked() {
  if (s_.shutting_down) return;
  std::vector<SchedJob> queued;
  for (const std::string& id : s_.queued) {
    const JobEntry& e = *s_.jobs.at(id);
    SchedJob j;
    j.id = id;
    j.priority = e.job.priority();
    j.order = e.submit_order;
    j.stages = e.gang.stages;
    j.replicas = e.gang.replicas;
    j.device = e.worker_spec.device();
    queued.push_back(std::move(j));
  }
  if (queued.empty()) return;
  SchedDecision decision = Schedule(std::move(queued), SchedWorkersLocked());
  for (const SchedDecision::Start& start : decision.starts) {
    StartJobLocked(*s_.jobs.at(start.job_id), start.worker_ids);
  }
  for (const auto& [id, waiting] : decision.waiting) {
    SetWaitingLocked(*s_.jobs.at(id), waiting);
  }
}

std::vector<SchedWorker> GangStarter::SchedWorkersLocked() {
  std::set<std::string> holders;
  for (const std::string& id : s_.queued) {
    const JobEntry& e = *s_.jobs.at(id);
    if (e.job.state() != v1::RECOVERING) continue;
    for (const auto& [step, per_rank] : e.snapshot_holders) {
      for (const std::set<std::string>& ids : per_rank) {
        for (const std::string& w : ids) {
          if (HoldsSnapshotsOfLocked(w, id)) holders.insert(w);
        }
      }
    }
  }
  std::vector<const WorkerEntry*> ordered;
  for (const auto& [id, w] : s_.workers) ordered.push_back(&w);
  std::sort(ordered.begin(), ordered.end(),
            [&holders](const WorkerEntry* a, const WorkerEntry* b) {
              const bool ha = holders.count(a->id) > 0;
              const bool hb = holders.count(b->id) > 0;
              if (ha != hb) return ha;
              return a->register_order < b->register_order;
            });
  std::vector<SchedWorker> workers;
  for (const WorkerEntry* w : ordered) {
    workers.push_back(
        {w->id, w->caps.device(),
         w->job_id.empty() && w->stale_job.empty() && !w->shutting_down});
  }
  return workers;
}

void GangStarter::SetWaitingLocked(JobEntry& e, const std::string& waiting) {
  const std::string reason =
      e.job.state() == v1::RECOVERING
          ? absl::StrCat(RestartLabel(e), ": ", waiting, "; after: ",
                         e.job.restart_reasons().empty()
                             ? std::string("?")
                             : *e.job.restart_reasons().rbegin())
          : waiting;
  if (e.job.reason() == reason) return;
  e.job.set_reason(reason);
  records_.CommitLocked(e, nullptr);
}

void GangStarter::StartJobLocked(JobEntry& e,
                                 const std::vector<std::string>& chosen) {
  const std::string& job_id = e.job.job_id();
  const bool restart = e.job.state() == v1::RECOVERING;
  const std::vector<std::string> worker_ids =
      restart ? KeepRanks(e.job, chosen) : chosen;
  std::optional<v1::SnapshotResume> snapshot;
  if (restart && !e.snapshots_failed) {
    snapshot = ChooseSnapshotLocked(e, worker_ids);
  }
  s_.queued.erase(job_id);
  v1::StageAssignment assign = NewAssignment(e, snapshot, restart);
  AttachGangLocked(e, worker_ids, assign);
  ResetForNewGang(e, worker_ids.size(), restart);
  s_.rendezvous.Open(job_id);
  telemetry_.TracesLocked(e);
  telemetry_.LogRingLocked(e);
  records_.SetStateLocked(e, v1::RUNNING, StartReason(e, snapshot, restart));
  for (size_t k = 0; k < worker_ids.size(); ++k) {
    v1::ControllerMessage msg;
    *msg.mutable_assign() = assign;
    msg.mutable_assign()->set_rank(static_cast<int>(k));
    s_.outbox.SendLocked(s_.workers.at(worker_ids[k]).link, std::move(msg));
  }
  LOG(INFO) << "job " << job_id << " started on " << worker_ids.size()
            << " worker(s)";
}

void GangStarter::AttachGangLocked(JobEntry& e,
                                   const std::vector<std::string>& worker_ids,
                                   v1::StageAssignment& assign) {
  e.job.clear_workers();
  for (size_t k = 0; k < worker_ids.size(); ++k) {
    WorkerEntry& w = s_.workers.at(worker_ids[k]);
    w.job_id = e.job.job_id();
    w.rank = static_cast<int>(k);
    w.last_job = e.job.job_id();
    e.job.add_workers(w.id);
    assign.add_peer_addresses(w.caps.peer_address());
    *assign.add_placements() = PlacementOf(w.caps);
  }
}

void GangStarter::MaybeRequeueLocked(JobEntry& e, absl::Time now) {
  if (e.job.state() != v1::RECOVERING || !e.draining_workers.empty() ||
      now < e.restart_not_before) {
    return;
  }
  s_.queued.insert(e.job.job_id());
}

bool GangStarter::HoldsSnapshotsOfLocked(const std::string& id,
                                         const std::string& job_id) {
  auto it = s_.workers.find(id);
  return it != s_.workers.end() && it->second.last_job == job_id;
}

std::optional<v1::SnapshotResume> GangStarter::ChooseSnapshotLocked(
    const JobEntry& e, const std::vector<std::string>& gang) {
  for (auto it = e.snapshot_holders.rbegin(); it != e.snapshot_holders.rend();
       ++it) {
    const int64_t step = it->first;
    // Never past the published steps: the ones after them would be lost.
    if (step > e.job.steps_completed()) continue;
    if (step <= e.newest_checkpoint) break;
    v1::SnapshotResume resume;
    resume.set_step(step);
    for (int k = 0; k < e.gang.size(); ++k) {
      int source = -1;
      for (size_t r = 0; r < gang.size(); ++r) {
        if (it->second[k].count(gang[r]) == 0 ||
            !HoldsSnapshotsOfLocked(gang[r], e.job.job_id())) {
          continue;
        }
        // The rank's own worker first: no transfer.
        if (source < 0 || static_cast<int>(r) == k) {
          source = static_cast<int>(r);
        }
      }
      if (source < 0) break;
      resume.add_source_ranks(source);
    }
    if (resume.source_ranks_size() == e.gang.size()) return resume;
  }
  return std::nullopt;
}

}  // namespace trainyard
