#include "controller/job_records.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace trainyard {
namespace {

// Longest note text kept in a job's history; a worker's reason is cut
// there.
constexpr size_t kMaxNoteBytes = 1024;

}  // namespace

JobEventLog* JobRecords::EventLogLocked(JobEntry& e) {
  if (e.event_log != nullptr) return e.event_log.get();
  const std::string& id = e.job.job_id();
  const int64_t keep = s_.options.events_in_memory;  // >= 1 (Create)
  absl::StatusOr<int64_t> next = s_.store->NextEventSeq(id);
  absl::StatusOr<std::vector<v1::JobEvent>> tail = std::vector<v1::JobEvent>();
  if (next.ok() && *next > 0) {
    tail = s_.store->LoadEvents(id, std::max<int64_t>(*next - keep, 0),
                                std::min(*next, keep));
  }
  if (!next.ok() || !tail.ok()) {
    LOG(ERROR) << "job " << id << ": loading its events: "
               << (next.ok() ? tail.status() : next.status());
    next = 0;
    tail = std::vector<v1::JobEvent>();
  }
  e.next_seq = *next;
  // The job's row says where it stands, whatever the events in memory.
  v1::JobStateChange state;
  state.set_state(e.job.state());
  state.set_reason(e.job.reason());
  std::shared_ptr<JobStore> store = s_.store;
  e.event_log = std::make_shared<JobEventLog>(
      e.next_seq - static_cast<int64_t>(tail->size()), *std::move(tail), state,
      keep, [store, id](int64_t from, int64_t count) {
        return store->LoadEvents(id, from, count);
      });
  if (e.next_seq == 0) {
    // Keep the invariant that a log starts with the job's state, stored
    // like any other event.
    v1::JobEvent first;
    first.set_job_id(id);
    *first.mutable_state() = state;
    CommitLocked(e, &first);
  }
  // An ended job's events loaded again (for a watcher) are dropped again
  // like any ended job's.
  if (IsTerminal(e.job.state())) telemetry_.KeepEventLogLocked(e);
  return e.event_log.get();
}

void JobRecords::CommitLocked(JobEntry& e, v1::JobEvent* event) {
  JobEventLog* log = EventLogLocked(e);
  if (event != nullptr) event->set_job_id(e.job.job_id());
  absl::Status st = s_.store->UpdateJob(e.job, e.next_seq, event);
  // The in-memory state goes on even if the disk write failed: running jobs
  // must keep being served; the error is loud in the log. The event keeps
  // its number all the same (a gap in the store), so that the log's
  // numbers stay the store's: a watcher reading that part of the history
  // from the store later finds the event missing, not another in its
  // place.
  if (!st.ok()) {
    LOG(ERROR) << "persisting job " << e.job.job_id() << ": " << st;
  }
  if (event != nullptr) {
    ++e.next_seq;
    log->Append(*event);
  }
}

void JobRecords::SetStateLocked(JobEntry& e, v1::JobState state,
                                const std::string& reason) {
  e.job.set_state(state);
  e.job.set_reason(reason);
  if (state == v1::RUNNING && e.job.start_time_ms() == 0) {
    e.job.set_start_time_ms(absl::ToUnixMillis(absl::Now()));
  }
  if (IsTerminal(state)) e.job.set_end_time_ms(absl::ToUnixMillis(absl::Now()));
  v1::JobEvent event;
  event.mutable_state()->set_state(state);
  event.mutable_state()->set_reason(reason);
  CommitLocked(e, &event);
  if (IsTerminal(state)) telemetry_.EndLocked(e);
}

void JobRecords::NoteLocked(JobEntry& e, int rank, std::string text) {
  if (text.size() > kMaxNoteBytes) text.resize(kMaxNoteBytes);
  if (!e.notes.insert(text).second) return;
  LOG(INFO) << "job " << e.job.job_id() << " stage " << rank << ": " << text;
  v1::JobEvent event;
  v1::JobNote* note = event.mutable_note();
  note->set_stage(rank);
  note->set_step(e.job.steps_completed());
  note->set_text(std::move(text));
  CommitLocked(e, &event);
}

void JobRecords::FinishJobLocked(JobEntry& e, v1::JobState state,
                                 const std::string& reason,
                                 bool cancel_workers) {
  for (auto& [id, w] : s_.workers) {
    if (w.job_id != e.job.job_id()) continue;
    if (cancel_workers) {
      s_.outbox.SendLocked(w.link, CancelStageMessage(e.job.job_id(), reason));
    }
    w.job_id.clear();
    w.rank = -1;
  }
  e.pending_steps.clear();
  e.draining_workers.clear();
  e.adopting = false;
  e.pending_failure.clear();
  e.failure_deadline = absl::InfiniteFuture();
  s_.queued.erase(e.job.job_id());
  // Ranks still waiting for a key fail now, naming why, instead of waiting
  // out their timeouts.
  SendRendezvousRepliesLocked(
      s_,
      s_.rendezvous.Close(
          e.job.job_id(),
          absl::AbortedError(absl::StrCat(
              "rendezvous of job ", e.job.job_id(), ": closed, the job ended ",
              v1::JobState_Name(state), reason.empty() ? "" : ": ", reason))));
  SetStateLocked(e, state, reason);
}

}  // namespace trainyard
