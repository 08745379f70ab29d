#include "controller/job_telemetry.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "observability/tensorboard_writer.h"

namespace trainyard {

TraceBuffer* JobTelemetry::TracesLocked(JobEntry& e) {
  if (e.traces == nullptr && !IsTerminal(e.job.state())) {
    e.traces =
        std::make_unique<TraceBuffer>(e.gang.size(), s_.options.trace_limits);
  }
  return e.traces.get();
}

LogRing* JobTelemetry::LogRingLocked(JobEntry& e) {
  if (e.log_ring == nullptr && !IsTerminal(e.job.state())) {
    e.log_ring = std::make_shared<LogRing>(s_.options.log_limits);
  }
  return e.log_ring.get();
}

void JobTelemetry::TakeLogLineLocked(WorkerEntry& w,
                                     const v1::StageLogLine& l) {
  // Only a rank the controller counts this worker in (running, or
  // draining for a restart): a line about anything else is not the job's.
  if (w.job_id.empty() || w.job_id != l.job_id() || w.rank != l.stage()) {
    return;
  }
  JobEntry& e = *s_.jobs.at(w.job_id);
  LogRing* ring = LogRingLocked(e);
  if (ring == nullptr) return;
  const JobManagerOptions& options = s_.options;
  const absl::Time now = absl::Now();
  if (w.log_refilled == absl::InfinitePast()) {
    w.log_tokens = options.log_burst;
  } else {
    w.log_tokens = std::min(
        options.log_burst,
        w.log_tokens + options.log_lines_per_second *
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
    line.set_time_ms(absl::ToUnixMillis(absl::Now()));
    line.set_severity(v1::LOG_SEVERITY_WARNING);
    line.set_text(absl::StrCat("(controller) ", w.logs_dropped,
                               " line(s) from worker ", WorkerLabel(w),
                               " dropped: more than ",
                               options.log_lines_per_second, " lines/s"));
    ring->Append(line);
    w.logs_dropped = 0;
  }
  line.set_time_ms(l.time_ms());
  line.set_severity(v1::LogSeverity_IsValid(l.severity())
                        ? l.severity()
                        : v1::LOG_SEVERITY_ERROR);
  // Cut before the copy: the text may be as long as a gRPC message.
  line.set_text(CutUtf8(l.text(), options.log_limits.max_line_bytes));
  ring->Append(std::move(line));
}

std::string JobTelemetry::TensorboardDir(const std::string& job_id) const {
  return absl::StrCat(s_.options.data_dir, "/tensorboard/", job_id);
}

void JobTelemetry::WriteTensorboardLocked(JobEntry& e,
                                          const v1::JobEvent& event) {
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

void JobTelemetry::EndLocked(JobEntry& e) {
  e.tensorboard.reset();  // closes the event file
  if (e.log_ring != nullptr) e.log_ring->Close();
  if (e.log_ring != nullptr || e.traces != nullptr) {
    // Open WatchLogs streams keep their (closed) ring until they finish.
    KeepNewestLocked(ended_with_telemetry_, e, [](JobEntry& old) {
      old.log_ring.reset();
      old.traces.reset();
    });
  }
  KeepEventLogLocked(e);
}

void JobTelemetry::KeepEventLogLocked(JobEntry& e) {
  if (e.event_log == nullptr) return;
  // Open WatchJob streams keep theirs until they finish; a later WatchJob
  // loads the job's events from the store again.
  KeepNewestLocked(ended_event_logs_, e,
                   [](JobEntry& old) { old.event_log.reset(); });
}

template <typename Drop>
void JobTelemetry::KeepNewestLocked(std::deque<std::string>& kept, JobEntry& e,
                                    Drop drop) {
  const std::string& id = e.job.job_id();
  if (std::find(kept.begin(), kept.end(), id) != kept.end()) return;
  kept.push_back(id);
  while (static_cast<int>(kept.size()) >
         std::max(1, s_.options.keep_ended_jobs)) {
    auto it = s_.jobs.find(kept.front());
    kept.pop_front();
    if (it != s_.jobs.end()) drop(*it->second);
  }
}

ControllerStats JobTelemetry::StatsLocked() {
  ControllerStats stats;
  for (int i = v1::JobState_MIN; i <= v1::JobState_MAX; ++i) {
    if (v1::JobState_IsValid(i) && i != v1::JOB_STATE_UNSPECIFIED) {
      stats.jobs[static_cast<v1::JobState>(i)] = 0;
    }
  }
  for (const auto& [id, e] : s_.jobs) {
    ++stats.jobs[e->job.state()];
    stats.restarts += e->job.restarts();
  }
  stats.queued = static_cast<int64_t>(s_.queued.size());
  for (const auto& [id, w] : s_.workers) {
    const std::string device =
        w.caps.device().empty() ? "cpu" : w.caps.device();
    ++stats.workers[{
        device, w.job_id.empty() && w.stale_job.empty() ? "idle" : "busy"}];
  }
  return stats;
}

}  // namespace trainyard
