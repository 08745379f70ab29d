// Job logs: the lines a worker logs (glog) about a stage it runs, sent to
// the controller as WorkerMessage.log for `trainyard logs`.
//
// Which lines belong to a job: every line logged on a thread while a
// ScopedJobLog for that job is alive on it. The worker keeps one on the
// thread that runs the stage for the stage's whole life (start-up, the
// transport, the steps, checkpoints, its end), and opens one around the
// job's lines it logs on other threads (a cancel, the checkpoint writer).
// Lines of other threads (the connection to the controller, the peer
// listener) are not sent.
//
// A process-wide glog LogSink (installed by the first JobLogForwarder)
// hands each such line to the scope's forwarder, which queues it without
// blocking or logging (glog holds its lock while sinks run) and sends it
// from its own thread. Bounded: at most `max_queued` lines wait (more are
// dropped), at most `lines_per_second` (bursts of `burst`) are taken, each
// cut at `max_line_bytes` on a UTF-8 boundary with invalid bytes replaced
// (the controller's parser refuses invalid UTF-8). Drops are counted, and
// said in the next line sent. Lines whose send fails (no controller) are
// lost: the worker does not keep log lines for resending.
//
// Thread safety: every method is thread-safe. A ScopedJobLog belongs to
// the thread that made it.
#ifndef TRAINYARD_ENGINE_JOB_LOG_H_
#define TRAINYARD_ENGINE_JOB_LOG_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

struct JobLogOptions {
  size_t max_queued = 1000;
  double lines_per_second = 100;
  double burst = 500;
  size_t max_line_bytes = 1024;
  // Taken off the front of a line that starts with it (the worker's own
  // "trainyard-worker NAME: ", which `trainyard logs` shows anyway).
  std::string drop_prefix;
};

// `text` with every byte that is not part of a valid UTF-8 character
// replaced by '?', cut to at most `max_bytes` bytes on a character
// boundary.
std::string SanitizeUtf8(absl::string_view text, size_t max_bytes);

class JobLogForwarder {
 public:
  // `send` writes one message to the controller; false when it could not
  // (the line is lost). Called from the forwarder's thread and Flush.
  explicit JobLogForwarder(std::function<bool(const v1::WorkerMessage&)> send,
                           JobLogOptions options = {});
  // Stops the sender thread; lines still queued are dropped.
  ~JobLogForwarder();
  JobLogForwarder(const JobLogForwarder&) = delete;
  JobLogForwarder& operator=(const JobLogForwarder&) = delete;

  // Queues a line of stage `stage` of `job_id`; `severity` is glog's (0
  // INFO, 1 WARNING, 2 ERROR and up). Never blocks, never logs.
  void Add(const std::string& job_id, int stage, int severity, int64_t time_ms,
           absl::string_view text);
  // Sends every line queued so far before returning (in order with the
  // sender thread), e.g. before the stage's end is reported.
  void Flush();

  // Lines dropped so far (queue full or over the rate).
  int64_t dropped() const;

 private:
  // Pops and sends everything queued; the caller holds send_mu_.
  void SendQueued() ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_);
  void Loop();

  const std::function<bool(const v1::WorkerMessage&)> send_;
  const JobLogOptions options_;

  // Held while lines are popped and sent, so they leave in order.
  absl::Mutex send_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;  // a leaf: never held while logging or sending
  std::deque<v1::WorkerMessage> queue_ ABSL_GUARDED_BY(mu_);
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time refilled_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_unsaid_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// While alive, lines logged on this thread are sent by `forwarder` as lines
// of stage `stage` of `job_id` (a scope inside another replaces it until it
// ends). `forwarder` may be null (nothing is sent).
class ScopedJobLog {
 public:
  ScopedJobLog(JobLogForwarder* forwarder, std::string job_id, int stage);
  ~ScopedJobLog();
  ScopedJobLog(const ScopedJobLog&) = delete;
  ScopedJobLog& operator=(const ScopedJobLog&) = delete;

  JobLogForwarder* forwarder() const { return forwarder_; }
  const std::string& job_id() const { return job_id_; }
  int stage() const { return stage_; }

 private:
  JobLogForwarder* const forwarder_;
  const std::string job_id_;
  const int stage_;
  ScopedJobLog* const outer_;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_JOB_LOG_H_
