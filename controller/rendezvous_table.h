// RendezvousTable: the controller's side of the rendezvous
// (transport/rendezvous.h): one write-once key-value store per running job,
// served to that job's workers over their WorkerService.Connect streams
// (RendezvousPut / RendezvousGet in, RendezvousReply out).
//
// Rules, as InProcessRendezvous: a key is written once (the same value
// again is a no-op, a different one AlreadyExists); a Get is answered when
// its key is put, or DeadlineExceeded after its timeout (capped at
// max_get_timeout). A job's store exists from Open (the job starts) to
// Close (it ends); Close answers every waiting Get with the status it is
// given (the JobManager passes Aborted naming the job's end), so a rank of
// a cancelled or failed job fails instead of waiting.
//
// Every size a worker controls is bounded (RendezvousLimits), so a hostile
// or buggy worker cannot grow the controller's memory: key and value
// length, keys per job, waiting Gets per job. Errors name the job, the key
// and the limit.
//
// Pure bookkeeping like controller/scheduler.h: no clock (callers pass
// `now`), no I/O, no membership checks (the JobManager checks that the
// worker runs a stage of the job). Calls return the replies to send.
//
// Thread safety: none; the JobManager calls it under its lock.
#ifndef TRAINYARD_CONTROLLER_RENDEZVOUS_TABLE_H_
#define TRAINYARD_CONTROLLER_RENDEZVOUS_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

struct RendezvousLimits {
  size_t max_key_bytes = 256;
  size_t max_value_bytes = 64 * 1024;
  int max_keys_per_job = 64;
  int max_pending_gets_per_job = 256;
  absl::Duration max_get_timeout = absl::Minutes(5);
};

class RendezvousTable {
 public:
  // A reply for the worker `worker_id`.
  struct Reply {
    std::string worker_id;
    v1::RendezvousReply reply;
  };

  explicit RendezvousTable(RendezvousLimits limits = RendezvousLimits())
      : limits_(limits) {}

  const RendezvousLimits& limits() const { return limits_; }

  // Starts an empty store for `job_id`, replacing any earlier one.
  void Open(const std::string& job_id);
  // Drops the job's store; every Get still waiting is answered with
  // `status` (must not be OK). No-op for a job without a store.
  std::vector<Reply> Close(const std::string& job_id,
                           const absl::Status& status);
  bool IsOpen(const std::string& job_id) const;

  // The Put's reply, then the replies to the Gets that waited for its key.
  // Errors (in the Put's reply): FailedPrecondition when the job has no
  // store; InvalidArgument for an empty or too long key or a too large
  // value; ResourceExhausted when the job already holds max_keys_per_job
  // keys; AlreadyExists when the key holds a different value.
  std::vector<Reply> Put(const std::string& worker_id,
                         const v1::RendezvousPut& put);
  // The Get's reply when it can be answered now (the value; an error as
  // for Put; DeadlineExceeded for a timeout <= 0 and an absent key), or
  // nothing: it waits until the key is put, Expire passes its deadline
  // (now + its timeout, capped), or Close. ResourceExhausted when
  // max_pending_gets_per_job Gets already wait in the job.
  std::vector<Reply> Get(const std::string& worker_id,
                         const v1::RendezvousGet& get, absl::Time now);
  // Answers every waiting Get whose deadline is <= now with
  // DeadlineExceeded naming the key and its timeout.
  std::vector<Reply> Expire(absl::Time now);
  // Moves every waiting Get's deadline `by` later: time the controller did
  // not run is not counted against a Get (controller/liveness.h).
  void Postpone(absl::Duration by);

  // Waiting Gets of the job (0 without a store); for tests and stats.
  int PendingGets(const std::string& job_id) const;

 private:
  struct PendingGet {
    std::string worker_id;
    int64_t request_id = 0;
    std::string key;
    absl::Duration timeout;  // as capped, for the error message
    bool capped = false;     // the worker asked for longer
    absl::Time deadline;
  };
  struct JobStore {
    std::map<std::string, std::string> values;
    std::vector<PendingGet> waiting;  // in arrival order
  };

  // "rendezvous of job job-3: "
  static std::string Prefix(const std::string& job_id);
  // InvalidArgument when `key` is empty or longer than the limit.
  absl::Status CheckKey(const std::string& job_id,
                        const std::string& key) const;

  const RendezvousLimits limits_;
  std::map<std::string, JobStore> jobs_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_RENDEZVOUS_TABLE_H_
