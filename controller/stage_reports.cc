#include "controller/stage_reports.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainyard {
namespace {

// How long a rank's failure waits for a lost-worker event to explain it.
absl::Duration FailureGrace(const JobManagerOptions& options) {
  return std::min(options.heartbeat_timeout, absl::Seconds(1));
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

JobEntry* StageReports::RunningJobOfLocked(const WorkerEntry& w,
                                           const std::string& job_id,
                                           int rank) {
  if (w.job_id.empty() || w.job_id != job_id || w.rank != rank) {
    return nullptr;
  }
  JobEntry& e = *s_.jobs.at(job_id);
  return e.job.state() == v1::RUNNING ? &e : nullptr;
}

void StageReports::HandleStepLocked(WorkerEntry& w,
                                    const v1::StageStepReport& r) {
  JobEntry* e = RunningJobOfLocked(w, r.job_id(), r.stage());
  if (e == nullptr) return;
  const int64_t step = r.step().step();
  if (r.has_trace()) {
    // Also for steps already published: the ranks' reports of one step
    // arrive on different streams, the loss rank's often first.
    v1::StageTrace trace = r.trace();
    trace.set_stage(r.stage());
    trace.set_worker_id(w.id);
    trace.set_worker_name(w.name);
    telemetry_.TracesLocked(*e)->AddStep(step, e->job.restarts(),
                                         std::move(trace));
  }
  if (r.stage() == e->loss_rank) {
    recovery_.RecordRecoveryLocked(*e, absl::Now());
  }
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
  v1::JobEvent event;
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
  records_.CommitLocked(*e, &event);
  telemetry_.WriteTensorboardLocked(*e, event);
}

void StageReports::HandleEvalLocked(WorkerEntry& w,
                                    const v1::StageEvalReport& r) {
  JobEntry* e = RunningJobOfLocked(w, r.job_id(), r.stage());
  if (e == nullptr) return;
  if (r.has_trace()) {
    v1::StageTrace trace = r.trace();
    trace.set_stage(r.stage());
    telemetry_.TracesLocked(*e)->AddEval(r.eval().step(), e->job.restarts(),
                                         trace);
  }
  // Every rank reports its evals (for their spans); the metrics are the
  // loss rank's.
  if (r.stage() != e->loss_rank) return;
  // A restarted gang recomputes evals it has already published.
  if (e->job.has_last_eval() && r.eval().step() <= e->job.last_eval().step()) {
    return;
  }
  v1::JobEvent event;
  *event.mutable_eval() = r.eval();
  *e->job.mutable_last_eval() = r.eval();
  records_.CommitLocked(*e, &event);
  telemetry_.WriteTensorboardLocked(*e, event);
}

void StageReports::HandleShardLocked(WorkerEntry& w,
                                     const v1::StageShardReport& r) {
  JobEntry* e = RunningJobOfLocked(w, r.job_id(), r.stage());
  if (e == nullptr || r.rows_total() < 0 || r.rows_done() < 0 ||
      r.rows_done() > r.rows_total() || r.shards_done() > r.shards_total()) {
    return;
  }
  v1::InferProgress* p = e->job.mutable_progress();
  const absl::Time now = absl::Now();
  if (e->progress_run != e->job.restarts()) {
    // This run's first report: its rate counts from here.
    e->progress_run = e->job.restarts();
    e->progress_since = now;
    e->progress_rows_at_start = std::max(p->rows_done(), r.rows_done());
  }
  p->set_rows_total(r.rows_total());
  p->set_shards_total(r.shards_total());
  if (r.rows_done() <= p->rows_done() && r.shards_done() <= p->shards_done()) {
    return;
  }
  p->set_rows_done(std::max(p->rows_done(), r.rows_done()));
  p->set_shards_done(std::max(p->shards_done(), r.shards_done()));
  const double seconds = absl::ToDoubleSeconds(now - e->progress_since);
  const int64_t rows = p->rows_done() - e->progress_rows_at_start;
  const double rate = seconds > 0 && rows > 0 ? rows / seconds : 0;
  p->set_rows_per_sec(rate);
  p->set_eta_seconds(rate > 0 ? (p->rows_total() - p->rows_done()) / rate : -1);
  v1::JobEvent event;
  *event.mutable_progress() = *p;
  records_.CommitLocked(*e, &event);
}

void StageReports::HandleDoneLocked(WorkerEntry& w, const v1::StageDone& d) {
  if (HandleOldStageDoneLocked(w, d)) return;
  JobEntry* e = RunningJobOfLocked(w, d.job_id(), d.stage());
  if (e == nullptr) return;
  if (d.ok()) {
    recovery_.RecordRecoveryLocked(*e, absl::Now());  // ended without a step
  } else {
    RecordFailureLocked(*e, w, d);
  }
  e->rank_ends[d.stage()] = d.ok() ? RankEnd::kSucceeded : RankEnd::kFailed;
  w.job_id.clear();
  w.rank = -1;
  if (std::none_of(e->rank_ends.begin(), e->rank_ends.end(),
                   [](RankEnd end) { return end == RankEnd::kRunning; })) {
    GangEndedLocked(*e);
  }
  gangs_.ScheduleLocked();
}

bool StageReports::HandleOldStageDoneLocked(WorkerEntry& w,
                                            const v1::StageDone& d) {
  if (!w.stale_job.empty() && w.stale_job == d.job_id() && w.job_id.empty()) {
    // The stage of a refused claim has ended: the worker is free.
    w.stale_job.clear();
    gangs_.ScheduleLocked();
    return true;
  }
  if (w.job_id.empty() || w.job_id != d.job_id() || w.rank != d.stage()) {
    return false;
  }
  JobEntry& old = *s_.jobs.at(w.job_id);
  if (old.job.state() != v1::RECOVERING) return false;
  // A rank of the old gang has stopped.
  w.job_id.clear();
  w.rank = -1;
  old.draining_workers.erase(w.id);
  gangs_.MaybeRequeueLocked(old, absl::Now());
  gangs_.ScheduleLocked();
  return true;
}

void StageReports::RecordFailureLocked(JobEntry& e, const WorkerEntry& w,
                                       const v1::StageDone& d) {
  std::string error = absl::StrCat(
      "stage ", d.stage(), " on worker ", WorkerLabel(w), " failed: ",
      d.error().empty() ? std::string("no error given") : d.error());
  if (!d.cancelled() && e.pending_failure.empty()) {
    e.pending_failure = error;
    e.pending_recoverable = IsRecoverableStageFailure(
        d.code() > 0 && d.code() <= 16 ? static_cast<absl::StatusCode>(d.code())
                                       : absl::StatusCode::kUnknown);
    e.failure_deadline = absl::Now() + FailureGrace(s_.options);
    // Stop the other ranks now; they report back as cancelled.
    for (auto& [id, other] : s_.workers) {
      if (other.job_id != e.job.job_id() || other.id == w.id) continue;
      s_.outbox.SendLocked(other.link,
                           CancelStageMessage(e.job.job_id(), error));
    }
  }
  if (e.first_cancel_error.empty()) e.first_cancel_error = error;
}

void StageReports::GangEndedLocked(JobEntry& e) {
  if (std::all_of(e.rank_ends.begin(), e.rank_ends.end(),
                  [](RankEnd end) { return end == RankEnd::kSucceeded; })) {
    records_.FinishJobLocked(
        e, v1::SUCCEEDED,
        absl::StrCat("all ", e.gang.size(), " stage(s) finished after step ",
                     e.job.steps_completed()),
        false);
    return;
  }
  recovery_.GangBrokenLocked(
      e, e.pending_failure.empty() ? e.first_cancel_error : e.pending_failure,
      e.pending_recoverable);
}

void StageReports::HandleTransportLocked(WorkerEntry& w,
                                         const v1::StageTransport& t) {
  JobEntry* e = RunningJobOfLocked(w, t.job_id(), t.stage());
  if (e == nullptr || t.stage() < 0 ||
      t.stage() >= static_cast<int>(e->transport_reported.size()) ||
      e->transport_reported[t.stage()]) {
    return;
  }
  e->transport_reported[t.stage()] = true;
  // Every rank decides from the same placements, so normally only rank
  // 0's note is new; a differing one is kept (it explains a failure).
  records_.NoteLocked(
      *e, t.stage(),
      absl::StrCat("transport: ", t.reason().empty() ? t.kind() : t.reason()));
}

void StageReports::HandleStartedLocked(WorkerEntry& w,
                                       const v1::StageStarted& started) {
  JobEntry* e = RunningJobOfLocked(w, started.job_id(), started.stage());
  if (e == nullptr || started.stage() < 0 ||
      started.stage() >= static_cast<int>(e->resume_steps.size())) {
    return;
  }
  e->resume_steps[started.stage()] = started.resume_step();
  if (e->recovery_reported || e->gang_restored != absl::InfiniteFuture()) {
    return;
  }
  for (int64_t r : e->resume_steps) {
    if (r < 0) return;
  }
  // Every rank of the restarted gang has restored its state (they agree
  // on the step: RunStage checks that before the first step). Snapshots of
  // later steps belong to the abandoned run (no new step is done yet).
  e->gang_restored = absl::Now();
  e->snapshot_holders.erase(e->snapshot_holders.upper_bound(e->resume_steps[0]),
                            e->snapshot_holders.end());
  if (e->progressed_early) {
    recovery_.RecordRecoveryLocked(*e, e->gang_restored);
  }
}

void StageReports::HandleHeldLocked(WorkerEntry& w, const v1::StateHeld& held) {
  if (w.job_id.empty() || w.job_id != held.job_id()) return;
  JobEntry& e = *s_.jobs.at(w.job_id);
  // Also while the old gang drains: a copy that arrived just before the
  // cancel is still a state to resume from.
  if (e.job.state() != v1::RUNNING && e.job.state() != v1::RECOVERING) return;
  if (held.stage() == -1) {
    e.newest_checkpoint = std::max(e.newest_checkpoint, held.step());
    return;
  }
  if (held.stage() < 0 || held.stage() >= e.gang.size() || held.step() <= 0) {
    return;
  }
  auto& per_rank = e.snapshot_holders[held.step()];
  per_rank.resize(e.gang.size());
  per_rank[held.stage()].insert(w.id);
  // Workers keep two steps per rank; a few more here cover ranks that
  // are a step apart.
  while (e.snapshot_holders.size() > 4) {
    e.snapshot_holders.erase(e.snapshot_holders.begin());
  }
}

}  // namespace trainyard
