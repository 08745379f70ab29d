#include "controller/liveness.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace trainyard {

void Liveness::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Liveness::Join() {
  if (thread_.joinable()) thread_.join();
}

void Liveness::Run() {
  absl::MutexLock lock(&s_.mu);
  last_tick_ = absl::Now();
  while (!s_.shutting_down) {
    s_.mu.AwaitWithTimeout(absl::Condition(&s_.shutting_down), period_);
    if (s_.shutting_down) break;
    TickLocked(absl::Now());
    s_.mu.Unlock();
    s_.outbox.Deliver();
    s_.mu.Lock();
  }
}

absl::Duration Liveness::StallBefore(absl::Time now) {
  const absl::Duration gap = now - last_tick_;
  last_tick_ = now;
  if (gap <= s_.options.heartbeat_interval) return absl::ZeroDuration();
  return gap - period_;
}

void Liveness::ExcuseStallLocked(absl::Duration stall, absl::Time now) {
  // Stalls that could have cost a worker are worth a line; shorter ones
  // come and go on a loaded machine.
  if (stall >= s_.options.heartbeat_timeout / 2) {
    LOG(WARNING) << "the controller did not run for "
                 << absl::FormatDuration(
                        absl::Trunc(stall, absl::Milliseconds(1)))
                 << " (stopped, starved of CPU, or blocked): not counted "
                    "against the workers' heartbeats or any deadline";
  }
  for (auto& [id, w] : s_.workers) {
    w.last_seen = std::min(now, w.last_seen + stall);
  }
  for (auto& [id, entry] : s_.jobs) {
    JobEntry& e = *entry;
    e.failure_deadline += stall;
    e.drain_deadline += stall;
    e.adopt_deadline += stall;
  }
  s_.rendezvous.Postpone(stall);
}

void Liveness::TickLocked(absl::Time now) {
  const absl::Duration stall = StallBefore(now);
  if (stall > absl::ZeroDuration()) ExcuseStallLocked(stall, now);
  SettleDeadlinesLocked(now);
  SendRendezvousRepliesLocked(s_, s_.rendezvous.Expire(now));
  std::vector<std::pair<std::string, absl::Duration>> lost;
  for (const auto& [id, w] : s_.workers) {
    absl::Duration silent = now - w.last_seen;
    if (silent > s_.options.heartbeat_timeout) lost.emplace_back(id, silent);
  }
  for (const auto& [id, silent] : lost) {
    LoseWorkerLocked(id, absl::StrFormat("no heartbeat for %.1f s",
                                         absl::ToDoubleSeconds(silent)));
  }
}

void Liveness::LoseWorkerLocked(const std::string& worker_id,
                                const std::string& why) {
  auto it = s_.workers.find(worker_id);
  if (it == s_.workers.end()) return;
  WorkerEntry w = std::move(it->second);
  s_.workers.erase(it);
  LOG(WARNING) << "worker " << WorkerLabel(w) << " lost: " << why;
  s_.outbox.CloseLocked(w.link, absl::UnavailableError(absl::StrCat(
                                    "worker ", w.id, " declared lost: ", why)));
  if (!w.job_id.empty()) {
    JobEntry& e = *s_.jobs.at(w.job_id);
    if (e.job.state() == v1::RUNNING) {
      recovery_.GangBrokenLocked(
          e,
          absl::StrCat("worker ", WorkerLabel(w), " running ",
                       RankLabel(w.rank, e.gang), " was lost: ", why),
          /*recoverable=*/true);
    } else if (e.job.state() == v1::RECOVERING) {
      e.draining_workers.erase(w.id);
      gangs_.MaybeRequeueLocked(e, absl::Now());
    }
  }
  gangs_.ScheduleLocked();
}

void Liveness::SettleDeadlinesLocked(absl::Time now) {
  const size_t queued_before = s_.queued.size();
  bool changed = false;
  for (auto& [id, entry] : s_.jobs) {
    JobEntry& e = *entry;
    if (e.job.state() == v1::RECOVERING) {
      changed = SettleRecoveringLocked(e, now) || changed;
    } else if (e.job.state() == v1::RUNNING) {
      changed = SettleRunningLocked(e, now) || changed;
    }
  }
  if (changed || s_.queued.size() != queued_before) gangs_.ScheduleLocked();
}

bool Liveness::SettleRecoveringLocked(JobEntry& e, absl::Time now) {
  bool dropped = false;
  if (!e.draining_workers.empty() && now >= e.drain_deadline) {
    // A rank that ignores its cancel (stuck in a kernel, say) must not
    // hold the restart up: its worker is dropped, and when it reconnects
    // its claim is refused and it stays out of gangs until that stage
    // ends.
    const std::vector<std::string> stuck(e.draining_workers.begin(),
                                         e.draining_workers.end());
    for (const std::string& w : stuck) {
      if (s_.workers.count(w) == 0) {
        // Never came back (after a controller restart): it has stopped
        // its stage by itself (WorkerRegistered.adopt_timeout_ms).
        e.draining_workers.erase(w);
        continue;
      }
      LoseWorkerLocked(
          w, absl::StrCat("its stage of job ", e.job.job_id(),
                          " did not stop within ",
                          absl::FormatDuration(s_.options.drain_timeout),
                          " of the cancel"));
    }
    dropped = true;
  }
  gangs_.MaybeRequeueLocked(e, now);
  return dropped;
}

bool Liveness::SettleRunningLocked(JobEntry& e, absl::Time now) {
  if (e.adopting && now >= e.adopt_deadline) {
    std::vector<std::string> missing;
    for (int k = 0; k < e.gang.size(); ++k) {
      if (!e.claimed[k]) missing.push_back(absl::StrCat(k));
    }
    recovery_.GangBrokenLocked(
        e,
        absl::StrCat("the controller restarted and stage(s) ",
                     absl::StrJoin(missing, ", "),
                     " were not reclaimed by their workers within ",
                     absl::FormatDuration(s_.options.adopt_timeout)),
        /*recoverable=*/true);
    return true;
  }
  if (e.pending_failure.empty() || now < e.failure_deadline) return false;
  recovery_.GangBrokenLocked(e, e.pending_failure, e.pending_recoverable);
  return true;
}

}  // namespace trainyard
