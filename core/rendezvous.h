// Rendezvous: a small write-once key-value store through which the ranks of
// one job exchange the bytes they need before they can talk directly (the
// NCCL unique id today; addresses or keys later). Modelled on gloo's
// rendezvous/store.h.
//
// Contract: Put(key, value) publishes `value` under `key`; a key is written
// once (a second Put with the same value is a no-op, so retries are safe;
// with a different value it is AlreadyExists). Get(key, timeout) returns the
// value once some rank has put it, or DeadlineExceeded naming the key and
// the timeout. Keys are namespaced by the caller, conventionally
// "<job_id>/<what>", e.g. "job-42/nccl_id".
//
// Implementations:
// - InProcessRendezvous (below): ranks as threads of one process (tests,
//   `trainyard train`, in-process multi-stage jobs).
// - Service rendezvous (not built yet): through the controller, over the
//   worker's existing WorkerService.Connect stream. Proto messages to add to
//   proto/trainyard.proto:
//     message RendezvousPut { string job_id = 1; string key = 2;
//                             bytes value = 3; int64 request_id = 4; }
//     message RendezvousGet { string job_id = 1; string key = 2;
//                             int64 timeout_ms = 3; int64 request_id = 4; }
//     message RendezvousReply { int64 request_id = 1; bytes value = 2;
//                               int32 code = 3; string error = 4; }
//   RendezvousPut / RendezvousGet as new fields of WorkerMessage.msg,
//   RendezvousReply of ControllerMessage.msg. The controller keeps a map
//   per running job (the same write-once rule), answers a Get when the key
//   appears or with DEADLINE_EXCEEDED after timeout_ms, and drops the map
//   when the job ends, so a rank of a cancelled job fails instead of
//   waiting. The worker side matches replies to calls by request_id.
//
// Thread safety: implementations are thread-safe; Get may block its caller
// only up to its timeout.
#ifndef TRAINYARD_CORE_RENDEZVOUS_H_
#define TRAINYARD_CORE_RENDEZVOUS_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trainyard {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;

  // Publishes `value` under `key`. Errors: InvalidArgument for an empty
  // key; AlreadyExists when `key` holds a different value.
  virtual absl::Status Put(const std::string& key, std::string value) = 0;

  // The value under `key`, waiting up to `timeout` for it to be put.
  // Errors: InvalidArgument for an empty key; DeadlineExceeded naming the
  // key when nobody put it in time.
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          absl::Duration timeout) = 0;
};

// Ranks as threads of one process. Shared by reference among them; it must
// outlive every call.
class InProcessRendezvous final : public Rendezvous {
 public:
  InProcessRendezvous() = default;
  InProcessRendezvous(const InProcessRendezvous&) = delete;
  InProcessRendezvous& operator=(const InProcessRendezvous&) = delete;

  absl::Status Put(const std::string& key, std::string value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_CORE_RENDEZVOUS_H_
