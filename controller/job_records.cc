#include "controller/job_records.h"

#include <memory>
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
  int64_t next_seq = 0;
  absl::StatusOr<std::vector<v1::JobEvent>> events =
      s_.store->LoadEvents(e.job.job_id(), &next_seq);
  if (!events.ok()) {
    LOG(ERROR) << events.status();
    events = std::vector<v1::JobEvent>();
  }
  e.next_seq = next_seq;
  if (events->empty()) {
    // Keep the invariant that a log starts with the job's state, stored
    // like any other event.
    v1::JobEvent first;
    first.set_job_id(e.job.job_id());
    first.mutable_state()->set_state(e.job.state());
    first.mutable_state()->set_reason(e.job.reason());
    absl::Status st = s_.store->UpdateJob(e.job, e.next_seq, &first);
    if (st.ok()) {
      ++e.next_seq;
    } else {
      LOG(ERROR) << "persisting job " << e.job.job_id() << ": " << st;
    }
    events->push_back(std::move(first));
  }
  e.event_log = std::make_shared<JobEventLog>(*std::move(events));
  return e.event_log.get();
}

void JobRecords::CommitLocked(JobEntry& e, v1::JobEvent* event) {
  JobEventLog* log = EventLogLocked(e);
  if (event != nullptr) event->set_job_id(e.job.job_id());
  absl::Status st = s_.store->UpdateJob(e.job, e.next_seq, event);
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
