// Collectives over point-to-point messages. As gloo separates pairs from
// algorithms, a transport provides ReducePeers (deliver one ReduceMessage
// to a rank, take the next from a rank, end a failed round) and the
// algorithm here decides what goes to whom and what is computed, once for
// every transport: the TCP transport carries the messages in frames of
// kinds 16-18 (docs/TRANSPORT_FRAME.md), the in-process hub in queues. The
// NCCL transport keeps ncclAllReduce (transport/nccl_transport.h says why).
//
// Thread safety: one thread per rank, as transport/transport.h.
#ifndef TRAINYARD_TRANSPORT_COLLECTIVES_H_
#define TRAINYARD_TRANSPORT_COLLECTIVES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainyard {

// One message of a rank-ordered all-reduce round: a rank's contribution to
// rank 0, or rank 0's answer to a rank.
struct ReduceMessage {
  enum class Kind {
    kContribution,  // rank r -> rank 0: `values`
    kResult,        // rank 0 -> rank r: the sum, `values`
    kError,         // rank 0 -> rank r: why the round failed, `error`
  };
  Kind kind = Kind::kContribution;
  int64_t round = 0;
  std::vector<double> values;
  std::string error;
};

// "all-reduce-contribution", "all-reduce-result", "all-reduce-error".
const char* ReduceMessageKindName(ReduceMessage::Kind kind);

// "rank 2: all-reduce round 7": how errors of a round start.
std::string ReduceRoundName(int rank, int64_t round);

// What a transport provides for the collectives: point-to-point delivery
// of ReduceMessages, apart from its other messages, between this rank and
// the others.
class ReducePeers {
 public:
  virtual ~ReducePeers() = default;
  // Numbers this rank's next round (0, 1, ...; every rank counts its own).
  // An error fails the call before anything is sent.
  virtual absl::StatusOr<int64_t> StartReduceRound() = 0;
  // Queues `message` for `peer`; does not wait for the peer.
  virtual absl::Status SendReduce(int peer, ReduceMessage message) = 0;
  // The next message from `peer`, waiting until `deadline` (`timeout`, the
  // call's whole allowance, is for the error); this rank is in `round`.
  virtual absl::StatusOr<ReduceMessage> RecvReduce(int peer, int64_t round,
                                                   absl::Time deadline,
                                                   absl::Duration timeout) = 0;
  // Rank 0 cannot complete `round` because of `reason` ("rank 2 sent 5
  // values, rank 0 sent 4"): makes every other rank's call for the round
  // fail, and returns rank 0's error.
  virtual absl::Status FailReduceRound(int64_t round,
                                       const std::string& reason) = 0;
};

// Transport::AllReduceSum over `peers`, for rank `rank` of `world_size`:
// every other rank sends its values to rank 0, which takes them in rank
// order, checks their lengths, adds them in rank order starting from 0.0
// (0.0 + v0 + v1 + ..., so every rank and every transport gets bitwise the
// same sums) and sends the sum back. `timeout` bounds the whole call.
// Errors: the transport's (timeouts, aborts, connection errors); on rank 0
// the one FailReduceRound returns when a contribution is not this round's
// or its length differs; on the others InvalidArgument "<round>: rank 0
// failed the round: <why>" when rank 0 sends an error, Internal
// "<round>: unexpected <kind> frame for round <k> from rank 0" for an
// answer that is not this round's result.
absl::Status RankOrderedAllReduceSum(int rank, int world_size,
                                     ReducePeers* peers,
                                     std::vector<double>* values,
                                     absl::Duration timeout);

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_COLLECTIVES_H_
