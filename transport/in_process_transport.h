// In-process Transport: N ranks as threads of one process, sharing a hub of
// mutex-protected FIFO channels. Used by `trainyard train` and by tests of
// multi-stage logic before it runs across processes. AllReduceSum is
// transport/collectives.h's over the hub's own reduce channels.
//
// Errors: Abort, and an all-reduce whose ranks pass vectors of different
// lengths, abort the whole hub: every pending and later call on every rank
// fails with Aborted carrying the reason ("all-reduce: rank 2 sent 5
// values, rank 0 sent 4"). A wait that times out is DeadlineExceeded:
// "rank 1: no message from rank 0 within 1s", or "rank 1: all-reduce: 2
// rank(s) did not arrive within 1s".
//
// Ownership: InProcessHub owns every rank's Transport; it must outlive the
// threads that use them. Thread-safe as described in transport.h.
#ifndef TRAINYARD_TRANSPORT_IN_PROCESS_TRANSPORT_H_
#define TRAINYARD_TRANSPORT_IN_PROCESS_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "transport/collectives.h"
#include "transport/transport.h"

namespace trainyard {

class InProcessHub {
 public:
  explicit InProcessHub(int world_size);
  InProcessHub(const InProcessHub&) = delete;
  InProcessHub& operator=(const InProcessHub&) = delete;

  ~InProcessHub();
  Transport* rank(int r);
  int world_size() const { return static_cast<int>(ranks_.size()); }

 private:
  class Rank;
  friend class Rank;

  absl::Status Send(int from, int to, Message message);
  absl::StatusOr<Message> Recv(int to, int from, absl::Duration timeout);
  void Abort(const absl::Status& reason);

  // ReducePeers of each rank (transport/collectives.h).
  absl::StatusOr<int64_t> StartReduceRound(int rank);
  absl::Status SendReduce(int from, int to, ReduceMessage message);
  absl::StatusOr<ReduceMessage> RecvReduce(int to, int from, int64_t round,
                                           absl::Time deadline,
                                           absl::Duration timeout);
  absl::Status FailReduceRound(const std::string& reason);

  absl::Mutex mu_;
  std::map<std::pair<int, int>, std::deque<Message>> channels_
      ABSL_GUARDED_BY(mu_);  // (from, to) -> messages
  std::map<std::pair<int, int>, std::deque<ReduceMessage>> reduce_channels_
      ABSL_GUARDED_BY(mu_);  // (from, to) -> all-reduce messages
  // By rank: how many all-reduce rounds it has started.
  std::vector<int64_t> rounds_started_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_IN_PROCESS_TRANSPORT_H_
