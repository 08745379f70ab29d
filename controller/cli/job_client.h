// JobClient: the user side of trainyard.v1.JobService, with the retry and
// reconnect rules a CLI needs: every call has a deadline; SubmitJob retries
// transient failures with the same request id (so a retry never makes a
// second job); Watch reconnects after a dropped stream and resumes from the
// last step it saw, so the caller sees every step exactly once.
//
// Thread safety: a JobClient may be used from several threads.
#ifndef TRAINYARD_CONTROLLER_CLI_JOB_CLIENT_H_
#define TRAINYARD_CONTROLLER_CLI_JOB_CLIENT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/trainyard.grpc.pb.h"

namespace trainyard {

// grpc::Status -> absl::Status with the same code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

class JobClient {
 public:
  explicit JobClient(const std::string& controller_address,
                     absl::Duration rpc_timeout = absl::Seconds(10));

  const std::string& address() const { return address_; }

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
  std::string address_;
  absl::Duration rpc_timeout_;
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

#endif  // TRAINYARD_CONTROLLER_CLI_JOB_CLIENT_H_
