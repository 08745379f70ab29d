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
// - RemoteRendezvous (below): a store in another process, reached through
//   requests and replies matched by request id. The worker daemon runs one
//   per NCCL job over its WorkerService.Connect stream to the controller
//   (proto/trainyard.proto: RendezvousPut and RendezvousGet in
//   WorkerMessage, RendezvousReply in ControllerMessage). The controller
//   keeps one store per running job (controller/rendezvous_table.h: the
//   same write-once rule, bounded sizes, Gets answered when the key appears
//   or DEADLINE_EXCEEDED after their timeout), refuses workers that run no
//   stage of the job, and drops the store when the job ends, answering
//   waiting Gets with ABORTED, so a rank of a cancelled or failed job fails
//   instead of waiting.
//
// Thread safety: implementations are thread-safe; Get may block its caller
// only up to its timeout.
#ifndef TRAINYARD_TRANSPORT_RENDEZVOUS_H_
#define TRAINYARD_TRANSPORT_RENDEZVOUS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
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

// A rendezvous answered by a store in another process. Each call becomes
// one request, handed to `send` with a request id unique in this process
// (so a late reply meant for an earlier RemoteRendezvous is never taken for
// a call of a later one), and waits for OnReply with that id, for Abort, or
// for its own deadline: a Put waits up to `reply_timeout`, a Get its
// timeout plus `reply_timeout` (the store answers a Get that times out
// itself; the extra time covers the trip back).
//
// Errors beyond Rendezvous's: the store's own (its code and message, e.g.
// AlreadyExists, or Aborted when the job ended); Unavailable naming
// `remote` when `send` fails; DeadlineExceeded naming `remote` and the key
// when no reply comes in time; after Abort(status), `status` itself.
//
// Ownership: the owner must not destroy it while a call is in flight
// (Abort first and let the calls return). Thread safety: every method may
// be called from any thread; `send` is called without internal locks held.
class RemoteRendezvous final : public Rendezvous {
 public:
  struct Request {
    enum class Kind { kPut, kGet };
    int64_t id = 0;
    Kind kind = Kind::kPut;
    std::string key;
    std::string value;                              // Put only
    absl::Duration timeout = absl::ZeroDuration();  // Get only
  };
  // Hands `request` to the store; false when that is impossible now (the
  // connection is down). May block (e.g. on flow control).
  using Sender = std::function<bool(const Request& request)>;

  // `remote` names the store in errors, e.g. "controller 10.0.0.2:7070".
  RemoteRendezvous(std::string remote, Sender send,
                   absl::Duration reply_timeout = absl::Seconds(10));
  RemoteRendezvous(const RemoteRendezvous&) = delete;
  RemoteRendezvous& operator=(const RemoteRendezvous&) = delete;

  absl::Status Put(const std::string& key, std::string value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;

  // The store's answer to request `request_id`: a Get's value, OK for a
  // Put, or an error. Ignored when no call waits for that id (it gave up).
  void OnReply(int64_t request_id, absl::StatusOr<std::string> result);

  // Fails every waiting and later call with `status` (not OK), e.g.
  // Unavailable when the connection to the store dropped, or the job's
  // cancellation. The first status wins.
  void Abort(const absl::Status& status);

 private:
  // Sends `request` and waits for its reply until `deadline`.
  absl::StatusOr<std::string> Call(Request request, absl::Time deadline);

  const std::string remote_;
  const Sender send_;
  const absl::Duration reply_timeout_;

  absl::Mutex mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  // The ids of the calls waiting for a reply, and the replies that came
  // for them; a call removes both when it returns.
  std::set<int64_t> pending_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, absl::StatusOr<std::string>> replies_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_RENDEZVOUS_H_
