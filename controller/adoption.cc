#include "controller/adoption.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "plan/job_plan.h"

namespace trainyard {
namespace {

// Why `claim` of e's rank cannot be granted; empty when it can.
std::string ClaimRefusal(const JobEntry& e, const v1::StageClaim& claim) {
  const int k = claim.stage();
  if (IsTerminal(e.job.state())) {
    return absl::StrCat("the job is ", v1::JobState_Name(e.job.state()));
  }
  if (!e.adopting || e.job.state() != v1::RUNNING) {
    return absl::StrCat("the job is ", v1::JobState_Name(e.job.state()),
                        " and not waiting for its stages to be "
                        "reclaimed");
  }
  if (claim.attempt() != e.job.restarts()) {
    return absl::StrCat("the claim is for attempt ", claim.attempt(),
                        ", the job is at attempt ", e.job.restarts());
  }
  if (k < 0 || k >= e.gang.size() || e.claimed[k]) {
    return absl::StrCat("stage ", k, " is not free to reclaim");
  }
  return std::string();
}

}  // namespace

absl::Status Adoption::LoadJobs() {
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, s_.store->LoadJobs());
  absl::MutexLock lock(&s_.mu);
  const absl::Time now = absl::Now();
  int64_t order = 0;
  for (v1::Job& job : jobs) {
    JobEntry& e = AddLoadedJobLocked(std::move(job), ++order);
    if (!IsTerminal(e.job.state())) TakeUpLocked(e, now);
  }
  return absl::OkStatus();
}

JobEntry& Adoption::AddLoadedJobLocked(v1::Job job, int64_t order) {
  auto e = std::make_unique<JobEntry>();
  e->submit_order = order;
  e->job = std::move(job);
  s_.job_by_request[RequestKey(e->job.owner(), e->job.request_id())] =
      e->job.job_id();
  JobEntry& entry = *e;
  s_.jobs[e->job.job_id()] = std::move(e);
  // Worker ids stay unique across restarts, so a reconnecting worker can
  // keep its id without colliding with a new one.
  for (const std::string& id : entry.job.workers()) {
    int64_t n = 0;
    if (absl::StartsWith(id, "w-") && absl::SimpleAtoi(id.substr(2), &n)) {
      s_.next_worker = std::max(s_.next_worker, n + 1);
    }
  }
  return entry;
}

void Adoption::TakeUpLocked(JobEntry& e, absl::Time now) {
  absl::StatusOr<JobPlan> plan =
      PlanJob(e.job.spec(), ControllerPlanOptions(s_.options));
  if (!plan.ok()) {
    records_.FinishJobLocked(
        e, v1::FAILED,
        absl::StrCat("spec no longer valid after restart: ",
                     plan.status().message()),
        false);
    return;
  }
  SetPlan(e, *plan);
  switch (e.job.state()) {
    case v1::RUNNING:
      AwaitClaimsLocked(e, now);
      break;
    case v1::RECOVERING:
      AwaitOldGangLocked(e, now);
      break;
    default:
      s_.queued.insert(e.job.job_id());
      break;
  }
}

void Adoption::AwaitClaimsLocked(JobEntry& e, absl::Time now) {
  // Its workers keep training while no controller listens; wait for them
  // to reconnect and claim their ranks.
  const int ranks = e.gang.size();
  e.adopting = true;
  e.adopt_deadline = now + s_.options.adopt_timeout;
  e.claimed.assign(ranks, false);
  e.rank_ends.assign(ranks, RankEnd::kRunning);
  e.resume_steps.assign(ranks, 0);
  s_.rendezvous.Open(e.job.job_id());
  // Notes already in its history are not recorded again when the workers
  // resend their reports, nor is any rank's transport.
  const JobEventLog* log = records_.EventLogLocked(e);
  std::vector<v1::JobEvent> events;
  for (int64_t i = 0; i < log->size(); i += JobEventLog::kEventsPerRead) {
    events.clear();
    absl::Status st = log->Read(i, JobEventLog::kEventsPerRead, &events);
    if (!st.ok()) {
      // Notes may then be recorded twice; nothing worse.
      LOG(ERROR) << "job " << e.job.job_id() << ": " << st;
      break;
    }
    for (const v1::JobEvent& ev : events) {
      if (ev.has_note()) e.notes.insert(ev.note().text());
    }
  }
  e.transport_reported.assign(ranks, true);
  LOG(INFO) << "job " << e.job.job_id() << " was RUNNING: waiting up to "
            << absl::FormatDuration(s_.options.adopt_timeout)
            << " for its workers to reclaim its " << ranks << " stage(s)";
}

void Adoption::AwaitOldGangLocked(JobEntry& e, absl::Time now) {
  // The old gang was being stopped, and may not have heard so: wait for
  // its workers to reconnect (their claims are refused, and they stop) or
  // for adopt_timeout, after which a worker still cut off from the
  // controller has stopped its stage by itself.
  e.loss_detected = now;
  e.loss_detected_step = e.job.steps_completed();
  e.restart_not_before = now;
  for (const std::string& w : e.job.workers()) {
    if (!w.empty()) e.draining_workers.insert(w);
  }
  e.drain_deadline = now + s_.options.adopt_timeout;
  gangs_.MaybeRequeueLocked(e, now);
}

void Adoption::ClaimStageLocked(WorkerEntry& w, const v1::StageClaim& claim) {
  auto it = s_.jobs.find(claim.job_id());
  JobEntry* e = it == s_.jobs.end() ? nullptr : it->second.get();
  const std::string refusal =
      e == nullptr ? std::string("no such job") : ClaimRefusal(*e, claim);
  if (refusal.empty()) {
    ReclaimLocked(*e, w, claim.stage());
  } else {
    RefuseClaimLocked(e, w, claim, refusal);
  }
}

void Adoption::ReclaimLocked(JobEntry& e, WorkerEntry& w, int rank) {
  e.claimed[rank] = true;
  w.job_id = e.job.job_id();
  w.rank = rank;
  w.last_job = e.job.job_id();
  while (e.job.workers_size() < e.gang.size()) e.job.add_workers("");
  e.job.set_workers(rank, w.id);
  LOG(INFO) << "job " << e.job.job_id() << ": worker " << WorkerLabel(w)
            << " reclaimed stage " << rank;
  if (!std::all_of(e.claimed.begin(), e.claimed.end(),
                   [](bool c) { return c; })) {
    records_.CommitLocked(e, nullptr);
    return;
  }
  e.adopting = false;
  e.adopt_deadline = absl::InfiniteFuture();
  records_.NoteLocked(e, rank,
                      "controller restarted: every stage was reclaimed by "
                      "its worker; the job ran on (steps completed while it "
                      "was away are published as they arrive)");
}

void Adoption::RefuseClaimLocked(JobEntry* e, WorkerEntry& w,
                                 const v1::StageClaim& claim,
                                 const std::string& refusal) {
  LOG(INFO) << "worker " << WorkerLabel(w) << " claims stage " << claim.stage()
            << " of job " << claim.job_id() << " (attempt " << claim.attempt()
            << "): refused, " << refusal;
  if (e != nullptr && e->job.state() == v1::RECOVERING &&
      e->draining_workers.count(w.id) > 0) {
    // A rank of the old gang the restart waits for: attached as
    // draining, so that its end lets the restart go on.
    w.job_id = claim.job_id();
    w.rank = claim.stage();
  } else {
    w.stale_job = claim.job_id();
  }
  s_.outbox.SendLocked(
      w.link,
      CancelStageMessage(
          claim.job_id(),
          absl::StrCat("the controller does not run stage ", claim.stage(),
                       " of job ", claim.job_id(), " (attempt ",
                       claim.attempt(), ") on this worker: ", refusal)));
}

}  // namespace trainyard
