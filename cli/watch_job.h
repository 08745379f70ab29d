// Following a job to its end as `trainyard watch`, `submit --watch` and
// `up --run` do: WatchPrinter prints the job's events, WatchToEnd streams
// them (JobClient::Watch) and turns the job's end into an exit status.
#ifndef TRAINYARD_CLI_WATCH_JOB_H_
#define TRAINYARD_CLI_WATCH_JOB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"
#include "cli/job_client.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

// Prints a job's events to stdout: a live progress bar on a terminal, one
// plain line per step otherwise; states, evals, notes and restarts on lines
// of their own. Remembers the newest eval.
class WatchPrinter {
 public:
  WatchPrinter(int64_t total_steps, int64_t batch_size);

  void operator()(const trainyard::v1::JobEvent& e);
  // Ends the progress bar's line, if one is open.
  void EndBar();

  bool has_eval() const { return has_eval_; }
  const trainyard::v1::EvalMetrics& last_eval() const { return last_eval_; }

 private:
  void PrintStep(const trainyard::v1::StepMetrics& m);
  // An inference job's rows written, their rate and the time left.
  void PrintProgress(const trainyard::v1::InferProgress& p);
  void PrintRecovery(const trainyard::v1::JobRecovery& r);

  int64_t total_;
  int64_t batch_;
  bool tty_;
  bool bar_open_ = false;
  bool has_eval_ = false;
  trainyard::v1::EvalMetrics last_eval_;
};

// Watches the job from `from_step` to its end, printing its events with a
// WatchPrinter made from the job's spec, and hands the printer to `done`
// (when set) afterwards. `reconnect` and `stop` are JobClient::Watch's.
// Returns 0 only when the job SUCCEEDED, 1 when it ended otherwise, or
// ReportRpcError's status when a call failed.
int WatchToEnd(JobClient& client, const std::string& job_id, int64_t from_step,
               absl::Duration reconnect,
               const std::function<void(const WatchPrinter&)>& done = nullptr,
               const std::atomic<bool>* stop = nullptr);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_WATCH_JOB_H_
