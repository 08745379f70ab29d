// NCCL Transport: pipeline stages on distinct GPUs (one rank per GPU, on
// one or several hosts) exchanging messages with NCCL point-to-point calls
// and running the small all-reduce with ncclAllReduce. Same contract as
// transport/transport.h; transport/transport_select.h decides when a job uses
// it.
//
// Setup (CreateNcclTransport): rank 0 creates the NCCL unique ids and puts
// them under "<job_id>/nccl_id" in the job's Rendezvous; the other ranks Get
// them (init_timeout). The communicators are created with
// ncclCommInitRankConfig(blocking = 0) and polled with
// ncclCommGetAsyncError, so a peer that never joins is a DeadlineExceeded
// after init_timeout (the half-made communicators are aborted), not a hang.
//
// Three communicators over the same ranks, each with its own CUDA stream:
// "up" carries messages from a lower to a higher rank (activations), "down"
// from a higher to a lower rank (gradients), "reduce" the all-reduce. NCCL
// runs the operations of one communicator in issue order, so with a single
// one a 1F1B schedule deadlocks (stage 0's second activation send queues
// behind its gradient receive, which waits for stage 1, whose receive of
// that activation queues behind its gradient send). With one communicator
// per direction every dependency points the same way along the pipeline.
//
// Wire format of a Message on the communicator of its direction: first one
// header of exactly kNcclHeaderBytes (transport/nccl_header.h: kind, step,
// microbatch, chunk, then the tensors' names, dtypes and shapes in the TCP
// frame's descriptor layout, written and read by transport/frame.h's codec),
// then each tensor's bytes (ncclUint8), in order. Headers are built in pinned
// host memory and copied to a device buffer, since NCCL only sends
// device-accessible memory. There is no checksum (NVLink / InfiniBand are
// link-level checked; TCP frames carry a CRC32C because they leave the
// machine's control).
//
// Connections: creation ends with one small exchange with each neighbour
// (rank - 1 and rank + 1) on both direction communicators and one
// all-reduce, so the links a pipeline uses are up before the first Send
// (which therefore never waits for a peer). A Send to a non-neighbour
// connects lazily, and its first call may wait for that peer's Recv, up to
// payload_timeout.
//
// Tensors and streams: core/tensor.h can only allocate CPU storage today.
// Send accepts CPU tensors (copied to a device staging buffer on the
// communication stream) and Device::Cuda(device) tensors (sent in place:
// their raw_data() is a device pointer, used once Tensor gets CUDA
// storage). Recv returns CPU tensors (received into device buffers and
// copied back); when Tensor can allocate on the device, Recv will return
// Device::Cuda tensors and skip the copy. Communication never runs on the
// compute stream: Send makes the communication stream wait for the work
// already queued on the compute stream (cudaEventRecord +
// cudaStreamWaitEvent, no host sync) before it reads the tensors, and Recv
// makes the compute stream wait for the receive before later kernels use
// the result. SetComputeStream tells the transport which stream that is
// (default: the legacy default stream, 0).
//
// All-reduce determinism: NCCL's summation order is not rank order (it
// depends on the algorithm, ring or tree, and the topology), unlike the
// in-process and TCP transports. Trainyard's all-reduce slots are still
// summed exactly: each gradient-norm slot has exactly one non-zero
// contributor (the stage owning that parameter; the others add 0.0, which
// is exact in any order), the loss-weight and loss slots come only from the
// last stage, and the checkpoint barrier adds small integers (exact in
// double). A future caller with several non-zero contributors per slot
// would lose bitwise reproducibility across topologies.
//
// Why ncclAllReduce and not the rank-ordered algorithm of
// transport/collectives.h that the in-process and TCP transports share:
// that algorithm's messages are taken without knowing their size in advance
// (an error of any length, a round number to check), and a round that rank
// 0 fails leaves the transport usable. Over NCCL point-to-point every
// receive must be posted with its exact size, and a wait that times out
// aborts the communicators, since NCCL cannot cancel a posted operation: each
// message would need the header exchange Send and Recv use, rank 0 would
// serialize 2 (n - 1) of them where one collective call does, and a failed
// round would still end the transport. For the slots above the sum is exact
// in any order, so ncclAllReduce gives them the same bits.
//
// Failures: NCCL, CUDA and the rendezvous report as Status (one macro per
// library, NCCL's text from ncclGetErrorString); nothing exits. Every wait
// polls ncclCommGetAsyncError, so a communicator error (e.g. a lost peer on
// the network) is returned as Unavailable naming the peer's rank. A wait that
// passes its timeout returns DeadlineExceeded and aborts the transport:
// NCCL cannot cancel one posted operation, so the communicators are
// unusable afterwards and every later call returns Aborted. Abort(status)
// calls ncclCommAbort on the three communicators (from the calling thread
// when the rank's thread is not inside a call, else by that thread within
// one poll interval) and fails every pending and future call with Aborted
// carrying the message. Peers of an aborted rank notice through their own
// timeouts (NCCL gives no signal across an NVLink when a peer dies).
//
// Thread safety: as transport.h: one thread per rank calls it (the thread
// whose CUDA device is set to `device` on every call); Abort from any.
#ifndef TRAINYARD_TRANSPORT_NCCL_TRANSPORT_H_
#define TRAINYARD_TRANSPORT_NCCL_TRANSPORT_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/rendezvous.h"
#include "transport/transport.h"

// cudaStream_t is `CUstream_st*` (driver_types.h); declared here so the
// header compiles without the CUDA toolkit.
struct CUstream_st;

namespace trainyard {

// True when this binary was built with CUDA and NCCL (@cuda available);
// false in the stub build, where CreateNcclTransport returns Unimplemented.
bool NcclTransportBuilt();

struct NcclTransportOptions {
  std::string job_id;  // rendezvous key prefix; must not be empty
  int rank = 0;
  int world_size = 1;
  int device = 0;                    // this rank's CUDA device ordinal
  Rendezvous* rendezvous = nullptr;  // not owned; used only during creation
  // Longest wait for the unique id and for every rank to join.
  absl::Duration init_timeout = absl::Seconds(60);
  // Once a message's header has arrived, how long its payloads may take
  // (on top of what is left of the Recv timeout), and the bound on NCCL's
  // enqueue calls in Send.
  absl::Duration payload_timeout = absl::Seconds(30);
  // Longest the destructor waits for queued sends to finish before it
  // aborts the communicators instead of finalizing them.
  absl::Duration shutdown_timeout = absl::Seconds(30);
  // Optional (not owned; must outlive the transport): when it becomes true
  // (the job was cancelled or failed) every wait, the communicators' join
  // during creation included, aborts the communicators and fails with
  // Cancelled within one poll interval.
  const std::atomic<bool>* cancel = nullptr;
};

class NcclTransport : public Transport {
 public:
  // The stream the stage's kernels run on (a cudaStream_t), which Send
  // waits for and Recv signals. Call before the first Send or Recv, from
  // the rank's thread; the stream must outlive the transport's calls.
  virtual void SetComputeStream(CUstream_st* stream) = 0;
};

// Checks `options` (InvalidArgument naming the field: empty job_id, null
// rendezvous, world_size < 1, rank outside [0, world_size), device < 0).
// Shared by the real and the stub build, so tested everywhere.
absl::Status ValidateNcclTransportOptions(const NcclTransportOptions& options);

// Creates rank `options.rank`'s transport and returns once every rank has
// joined. Errors: those of ValidateNcclTransportOptions; Unimplemented
// "built without CUDA/NCCL" in the stub build; FailedPrecondition when the
// machine has no CUDA device or driver; InvalidArgument when `device` is
// not one of its devices; DeadlineExceeded naming the rendezvous key or the
// ranks' join; Internal / Unavailable with NCCL's or CUDA's message.
absl::StatusOr<std::unique_ptr<NcclTransport>> CreateNcclTransport(
    const NcclTransportOptions& options);

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_NCCL_TRANSPORT_H_
