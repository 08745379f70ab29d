// Transport: how pipeline stages exchange tensors.
//
// Each stage (rank) owns one Transport. It sends activations forward and
// gradients backward to its neighbours and takes part in a small all-reduce
// (gradient-norm partial sums, loss weights); gradients themselves never go
// through the all-reduce. Implementations: in-process (stages as threads,
// transport/in_process_transport.h), TCP (stages in different processes or
// machines, transport/tcp_transport.h) and NCCL (one stage per GPU,
// transport/nccl_transport.h); transport/transport_select.h says which a
// job uses. The in-process and TCP transports share one all-reduce
// algorithm (transport/collectives.h).
//
// Contract:
// - Send is buffered: it may return before the peer receives, and it never
//   waits for the peer's Recv. The sender must not write to the sent
//   tensors afterwards (in-process delivery shares their storage).
// - Messages from one peer arrive in the order they were sent.
// - Every wait takes a timeout and returns DeadlineExceeded when it
//   passes; after Abort(status) every pending and future call on every rank
//   fails, carrying that status's message (in-process: code Aborted; TCP:
//   the aborting rank's own code, e.g. Cancelled, with its rank and address
//   named), so one failed stage stops the others instead of leaving them
//   waiting.
//
// Thread safety: one thread per rank calls its Transport; Abort may be
// called from any thread.
#ifndef TRAINYARD_TRANSPORT_TRANSPORT_H_
#define TRAINYARD_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/tensor.h"

namespace trainyard {

enum class MessageKind : int32_t {
  kActivation = 0,      // forward, training
  kGradient = 1,        // backward
  kEvalActivation = 2,  // forward, eval
  // A stage's serialized state ("snapshot": uint8), between steps
  // (JobSpec.recovery.snapshot_every); microbatch = the stage it belongs to.
  kSnapshot = 3,
};

const char* MessageKindName(MessageKind kind);

// One microbatch's tensors between neighbours.
struct Message {
  MessageKind kind = MessageKind::kActivation;
  int64_t step = 0;
  int32_t microbatch = 0;
  // Which of the receiving stage's model chunks the message is for (0 in a
  // schedule without chunks; schedule/schedule.h). 0 .. 65535 on the wire.
  int32_t chunk = 0;
  // By name; activations carry "x" plus the task's per-microbatch state.
  NamedTensors tensors;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // True when Send may carry tensors that live on a GPU as they are (the
  // in-process transport: the receiver shares the sender's storage, and
  // stages of one process that share a GPU share its stream). Otherwise
  // senders stage device tensors through the host.
  virtual bool SharesDeviceMemory() const { return false; }

  virtual absl::Status Send(int peer, Message message) = 0;
  virtual absl::StatusOr<Message> Recv(int peer, absl::Duration timeout) = 0;

  // Replaces `values` on every rank with the element-wise sum over ranks,
  // added in rank order (so every rank gets bitwise the same result). All
  // ranks must pass vectors of the same length.
  virtual absl::Status AllReduceSum(std::vector<double>* values,
                                    absl::Duration timeout) = 0;

  // Fails every pending and future call on every rank with `reason`.
  virtual void Abort(const absl::Status& reason) = 0;

  // Tensor bytes this rank has sent to and received from its peers so far
  // (frames' tensor data, not their headers); 0 where not counted (the
  // in-process and NCCL transports). Any thread.
  virtual int64_t payload_bytes_sent() const { return 0; }
  virtual int64_t payload_bytes_received() const { return 0; }
};

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_TRANSPORT_H_
