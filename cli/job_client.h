// JobClient: the user side of trainyard.v1.JobService, with the retry and
// reconnect rules a CLI needs: every call has a deadline; SubmitJob retries
// transient failures with the same request id (so a retry never makes a
// second job); Watch reconnects after a dropped stream and resumes from the
// last step it saw, so the caller sees every step exactly once.
//
// Thread safety: a JobClient may be used from several threads.
#ifndef TRAINYARD_CLI_JOB_CLIENT_H_
#define TRAINYARD_CLI_JOB_CLIENT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/trainyard.grpc.pb.h"
#include "security/tls.h"

namespace trainyard {

// grpc::Status -> absl::Status with the same code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

// How a client reaches the controller (README, "Security model").
struct JobClientSecurity {
  // Default: TLS verified against the system's roots; set ca_file to the
  // cluster CA, or insecure for a controller run with --insecure.
  TlsOptions tls;
  // Sent as "authorization: Bearer <token>" on every call over TLS; empty =
  // none. Never sent over plaintext (tls.insecure).
  std::string token;
};

class JobClient {
 public:
  // InvalidArgument naming the flag and file when a TLS file is missing or
  // not PEM. No connection is made until the first call.
  static absl::StatusOr<std::unique_ptr<JobClient>> Create(
      const std::string& controller_address, const JobClientSecurity& security,
      absl::Duration rpc_timeout = absl::Seconds(10));

  const std::string& address() const { return address_; }
  // Whether the channel uses TLS (for hints in error messages).
  bool tls() const { return tls_; }

  absl::StatusOr<trainyard::v1::Job> Submit(const trainyard::v1::JobSpec& spec,
                                            const std::string& request_id,
                                            int priority);
  absl::StatusOr<trainyard::v1::Job> Get(const std::string& job_id);
  absl::StatusOr<trainyard::v1::ListJobsResponse> List(
      const std::vector<trainyard::v1::JobState>& states, int page_size,
      const std::string& page_token);
  absl::StatusOr<trainyard::v1::Job> Cancel(const std::string& job_id,
                                            const std::string& reason);
  absl::StatusOr<trainyard::v1::ListWorkersResponse> ListWorkers();
  // Every stage's spans of `step` (0 = the newest step all stages have
  // reported).
  absl::StatusOr<trainyard::v1::GetTraceResponse> GetTrace(
      const std::string& job_id, int64_t step);

  // Streams the job's log lines held by the controller to on_line, oldest
  // first, then, with `follow`, new ones until the job ends. With follow,
  // a dropped stream is reconnected (for `reconnect_for`, then Unavailable)
  // from the line after the last one delivered, so no line is delivered
  // twice. *stop ends it within ~100 ms with Cancelled.
  absl::Status WatchLogs(
      const std::string& job_id, bool follow,
      const std::function<void(const trainyard::v1::LogLine&)>& on_line,
      absl::Duration reconnect_for = absl::Seconds(30),
      const std::atomic<bool>* stop = nullptr);

  // Streams the job's events from `from_step` until its terminal state,
  // calling on_event for each step and eval exactly once (in order) and for
  // each change of state. When the controller cannot be reached (at the
  // start or after a dropped stream) it keeps trying for `reconnect_for`,
  // then returns Unavailable. Setting *stop (from any thread, e.g. a signal
  // handler's flag) ends the watch within ~100 ms with Cancelled. Returns
  // the terminal state and its reason.
  absl::StatusOr<trainyard::v1::JobStateChange> Watch(
      const std::string& job_id, int64_t from_step,
      const std::function<void(const trainyard::v1::JobEvent&)>& on_event,
      absl::Duration reconnect_for = absl::Seconds(30),
      const std::atomic<bool>* stop = nullptr);

 private:
  JobClient() = default;

  // One stream of a follow: opens it with `ctx`, reads it (calling `alive`
  // for anything read), and returns the follow's result, or nullopt to
  // reconnect with `*error` saying why the stream ended.
  using StreamAttempt = std::function<std::optional<absl::Status>(
      grpc::ClientContext* ctx, const std::function<void()>& alive,
      std::string* error)>;
  // Runs `attempt` until it returns a result, reconnecting after a dropped
  // stream for up to `reconnect_for` of silence (then Unavailable naming
  // the last error); `*stop` cancels the stream and returns Cancelled.
  absl::Status FollowStream(absl::Duration reconnect_for,
                            const std::atomic<bool>* stop,
                            const StreamAttempt& attempt);
  // The deadline (unless `deadline` is false: streams) and the token.
  void Prepare(grpc::ClientContext* ctx, bool deadline = true) const;

  std::string address_;
  absl::Duration rpc_timeout_;
  std::string token_;
  bool tls_ = true;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<trainyard::v1::JobService::Stub> stub_;
};

// A fresh random request id ("req-" + 32 hex digits) for SubmitJob.
std::string NewRequestId();

// Makes the relative paths in a spec (data files, init weights, checkpoint
// dir) absolute against `base_dir`, as `trainyard train` resolves them, so a
// job submitted from any folder means the same files.
void ResolveSpecPaths(const std::string& base_dir,
                      trainyard::v1::JobSpec* spec);

// When block 0's in_features is unset and the train features are a .npy
// file this machine can read, sets it from the file's header. The
// controller validates without the data files (they may live only on the
// workers), so it cannot infer that width itself.
void FillInputWidthFromLocalData(trainyard::v1::JobSpec* spec);

const char* JobStateName(trainyard::v1::JobState state);
bool IsTerminal(trainyard::v1::JobState state);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_JOB_CLIENT_H_
