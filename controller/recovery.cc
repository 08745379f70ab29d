#include "controller/recovery.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "plan/job_plan.h"

namespace trainyard {
namespace {

// The wait before restart `k` (1-based) of a job: none for the first,
// then backoff_ms doubling each time, at most kMaxRestartBackoffMs.
int64_t RestartBackoffMs(int k, int64_t backoff_ms) {
  return k <= 1 ? 0
                : std::min<int64_t>(kMaxRestartBackoffMs,
                                    backoff_ms << std::min(k - 2, 20));
}

// Why a job whose gang broke by `cause` fails instead of restarting.
std::string FailureReason(const JobEntry& e, const std::string& cause,
                          bool recoverable) {
  if (e.max_restarts <= 0) return cause;
  if (!recoverable) {
    return absl::StrCat(cause,
                        " (not restarted: a restart would fail the "
                        "same way)");
  }
  std::vector<std::string> history;
  for (int k = 0; k < e.job.restart_reasons_size(); ++k) {
    history.push_back(
        absl::StrCat("restart ", k + 1, " after: ", e.job.restart_reasons(k)));
  }
  return absl::StrCat("gave up after ", e.job.restarts(),
                      " restart(s) (recovery.max_restarts = ", e.max_restarts,
                      "): ", absl::StrJoin(history, "; "), "; then: ", cause);
}

}  // namespace

void Recovery::GangBrokenLocked(JobEntry& e, std::string cause,
                                bool recoverable) {
  if (recoverable && e.job.restarts() < e.max_restarts) {
    BeginRecoveryLocked(e, cause);
    return;
  }
  records_.FinishJobLocked(e, v1::FAILED, FailureReason(e, cause, recoverable),
                           /*cancel_workers=*/true);
}

void Recovery::BeginRecoveryLocked(JobEntry& e, const std::string& cause) {
  const absl::Time now = absl::Now();
  const std::string& job_id = e.job.job_id();
  if (e.from_snapshot && e.gang_restored == absl::InfiniteFuture()) {
    // The last restart from snapshots broke before every rank restored:
    // later restarts read the checkpoint folder.
    e.snapshots_failed = true;
  }
  e.job.set_restarts(e.job.restarts() + 1);
  e.job.add_restart_reasons(cause);
  e.loss_detected = now;
  e.loss_detected_step = e.job.steps_completed();
  StopGangLocked(e, cause);
  e.pending_steps.clear();
  e.pending_failure.clear();
  e.failure_deadline = absl::InfiniteFuture();
  e.adopting = false;
  e.drain_deadline = now + s_.options.drain_timeout;
  const int64_t backoff_ms = RestartBackoffMs(e.job.restarts(), e.backoff_ms);
  e.restart_not_before = now + absl::Milliseconds(backoff_ms);
  SendRendezvousRepliesLocked(
      s_, s_.rendezvous.Close(
              job_id, absl::AbortedError(absl::StrCat(
                          "rendezvous of job ", job_id,
                          ": closed, the job is restarting: ", cause))));
  LOG(WARNING) << "job " << job_id << " " << RestartLabel(e) << " after step "
               << e.loss_detected_step << ": " << cause << "; stopping "
               << e.draining_workers.size() << " stage(s), backoff "
               << backoff_ms << " ms";
  records_.SetStateLocked(e, v1::RECOVERING,
                          absl::StrCat(RestartLabel(e), " after: ", cause));
  gangs_.MaybeRequeueLocked(e, now);
}

void Recovery::StopGangLocked(JobEntry& e, const std::string& cause) {
  const std::string& job_id = e.job.job_id();
  e.draining_workers.clear();
  for (auto& [id, w] : s_.workers) {
    if (w.job_id != job_id) continue;
    if (w.rank >= 0 && w.rank < static_cast<int>(e.rank_ends.size()) &&
        e.rank_ends[w.rank] == RankEnd::kRunning) {
      // Still running (or stuck on its lost neighbour): stop it, and wait
      // for its end before the checkpoint folder is read again.
      s_.outbox.SendLocked(
          w.link,
          CancelStageMessage(
              job_id, absl::StrCat("restarting job ", job_id, ": ", cause)));
      e.draining_workers.insert(id);
    } else {
      w.job_id.clear();
      w.rank = -1;
    }
  }
}

void Recovery::RecordRecoveryLocked(JobEntry& e, absl::Time now) {
  if (e.recovery_reported) return;
  if (e.gang_restored == absl::InfiniteFuture()) {
    // Recorded when the last StageStarted arrives.
    e.progressed_early = true;
    return;
  }
  e.recovery_reported = true;
  v1::JobEvent event;
  v1::JobRecovery* r = event.mutable_recovery();
  r->set_attempt(e.job.restarts());
  if (!e.job.restart_reasons().empty()) {
    r->set_cause(*e.job.restart_reasons().rbegin());
  }
  r->set_resume_step(e.resume_steps[0]);
  r->set_detected_step(e.loss_detected_step);
  r->set_reschedule_s(absl::ToDoubleSeconds(e.gang_assigned - e.loss_detected));
  r->set_restore_s(absl::ToDoubleSeconds(e.gang_restored - e.gang_assigned));
  r->set_warmup_s(absl::ToDoubleSeconds(now - e.gang_restored));
  r->set_detected_ms(absl::ToUnixMillis(e.loss_detected));
  *r->mutable_workers() = e.job.workers();
  r->set_step(e.job.steps_completed());
  r->set_from_snapshot(e.from_snapshot);
  LOG(INFO) << "job " << e.job.job_id() << " " << RestartLabel(e)
            << ": resumed after step " << r->resume_step() << " (the loss "
            << "was noticed after step " << r->detected_step() << "), "
            << r->reschedule_s() << " s to reschedule, " << r->restore_s()
            << " s to restore, " << r->warmup_s()
            << " s to the first step after it";
  records_.CommitLocked(e, &event);
}

}  // namespace trainyard
