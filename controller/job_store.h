// JobStore: the controller's durable state, one embedded SQLite database
// (<data_dir>/controller.db) in WAL mode.
//
// Tables (docs/CONTROLLER.md has the full schema):
//   jobs        one row per job: id, request_id (UNIQUE, the idempotency
//               key, per owner: RequestKey), the submitted spec as
//               serialized JobSpec bytes, state, reason, priority, times,
//               steps_completed, last step/eval, workers, restarts, owner.
//   job_events  the job's event history (JobEvent bytes keyed by job id and
//               a dense 0-based sequence number): state changes, every
//               StepMetrics and EvalMetrics. This is the metrics history
//               WatchJob replays (the newest events are also in memory:
//               controller/job_event_log.h).
//
// Every mutation is one transaction, so a SIGKILL at any point leaves either
// the old or the new state. synchronous=NORMAL: in WAL mode that is durable
// against a crash of the process (the WAL is in the OS page cache; SQLite
// replays it on open); only an OS crash or power loss can drop the last few
// commits, never corrupt the file. FULL would fsync on every step report,
// which costs more than the training step of a small model.
//
// Open changes nothing: jobs a previous process left QUEUED, RUNNING or
// RECOVERING are loaded as they were, and the JobManager decides what
// becomes of them (it re-adopts running jobs from their workers).
//
// Thread safety: all methods may be called from any thread (one internal
// mutex serializes access to the connection).
#ifndef TRAINYARD_CONTROLLER_JOB_STORE_H_
#define TRAINYARD_CONTROLLER_JOB_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/trainyard.pb.h"

struct sqlite3;

namespace trainyard {

// The idempotency key of a request: request ids are per owner, so one user
// cannot reach another's job by reusing its request id. User names have no
// ':' (security/tokens.h), so the key is unambiguous.
std::string RequestKey(const std::string& owner, const std::string& request_id);

class JobStore {
 public:
  // Opens (creating if needed) <data_dir>/controller.db; creates data_dir if
  // missing. Internal / FailedPrecondition naming the file on any error.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(
      const std::string& data_dir);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  struct Created {
    v1::Job job;
    bool created = false;  // false: request_id existed; `job` is that job
  };
  // Inserts a QUEUED job with a fresh id ("job-<n>") for `request_id`, plus
  // its first event (the QUEUED state change), or returns the job already
  // stored under the same owner and `request_id`. `job` supplies spec,
  // priority, reason, owner and create_time_ms; job_id/state are assigned
  // here.
  absl::StatusOr<Created> CreateJob(const v1::Job& job);

  // Rewrites the mutable columns of job.job_id() and, when `event` is not
  // null, appends it as event number `event_seq`, in one transaction.
  // NotFound if the job does not exist.
  absl::Status UpdateJob(const v1::Job& job, int64_t event_seq,
                         const v1::JobEvent* event);

  // NotFound naming the id.
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);

  // Every job, oldest first.
  absl::StatusOr<std::vector<v1::Job>> LoadJobs();

  // The sequence number the job's next event must use: one past the
  // highest stored (0 when none is).
  absl::StatusOr<int64_t> NextEventSeq(const std::string& job_id);

  // The job's events `from` .. `from + count - 1`, in order: element i is
  // event from + i. One that is missing (its write failed) or does not
  // parse is an empty JobEvent, and logged.
  absl::StatusOr<std::vector<v1::JobEvent>> LoadEvents(
      const std::string& job_id, int64_t from, int64_t count);

  // Newest first. `states` empty = all; `owner` null = everyone's, else
  // only that owner's jobs. Returns up to `limit` jobs created before the
  // job with creation number `before` (0 = from the newest); `next_before`
  // is set to the creation number to continue from, or 0 when there are no
  // more.
  absl::StatusOr<std::vector<v1::Job>> ListJobs(
      const std::vector<v1::JobState>& states, const std::string* owner,
      int limit, int64_t before, int64_t* next_before);

 private:
  JobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const std::string& sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // COMMIT, rolling back if it fails so no transaction is left open.
  absl::Status Commit() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Init() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CreateJob's insert of a new job and its first event, in one
  // transaction.
  absl::StatusOr<Created> InsertJob(const v1::Job& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
  const std::string path_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_JOB_STORE_H_
