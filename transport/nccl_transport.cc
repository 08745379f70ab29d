#include "transport/nccl_transport.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/frame.h"
#include "transport/nccl_header.h"

#ifdef TRAINYARD_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#endif

namespace trainyard {

absl::Status ValidateNcclTransportOptions(const NcclTransportOptions& o) {
  auto bad = [&](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl transport (job \"", o.job_id, "\", rank ", o.rank,
                     "): ", field, ": ", why));
  };
  if (o.job_id.empty()) return bad("job_id", "must not be empty");
  if (o.rendezvous == nullptr) return bad("rendezvous", "must not be null");
  if (o.world_size < 1) {
    return bad("world_size", absl::StrCat("must be >= 1, got ", o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return bad("rank", absl::StrCat("must be in [0, ", o.world_size, "), got ",
                                    o.rank));
  }
  if (o.device < 0) {
    return bad("device", absl::StrCat("must be >= 0, got ", o.device));
  }
  return absl::OkStatus();
}

#ifndef TRAINYARD_HAVE_NCCL

bool NcclTransportBuilt() { return false; }

absl::StatusOr<std::unique_ptr<NcclTransport>> CreateNcclTransport(
    const NcclTransportOptions& options) {
  absl::Status valid = ValidateNcclTransportOptions(options);
  if (!valid.ok()) return valid;
  return absl::UnimplementedError(
      absl::StrCat("nccl transport (job \"", options.job_id, "\", rank ",
                   options.rank, "): built without CUDA/NCCL"));
}

#else  // TRAINYARD_HAVE_NCCL

bool NcclTransportBuilt() { return true; }

namespace {

absl::Status FromNccl(ncclResult_t r, absl::string_view call, const char* file,
                      int line, absl::string_view context) {
  const std::string text =
      absl::StrCat(context, ": ", call, " failed at ", file, ":", line, ": ",
                   ncclGetErrorString(r), " (", ncclGetLastError(nullptr), ")");
  switch (r) {
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(text);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(text);
    default:
      return absl::InternalError(text);
  }
}

}  // namespace

// NCCL's macro, shaped like CUDA_RETURN_IF_ERROR(expr, context) of
// kernels/cuda/cuda_status.h (which this file uses for CUDA calls): run `expr`,
// turn a failure into a Status naming `context`, the call and its file:line,
// and return it. ncclInProgress is not a failure: with non-blocking
// communicators the caller then polls (WaitComm). Only this file calls NCCL.
#define NCCL_RETURN_IF_ERROR(expr, context)                            \
  do {                                                                 \
    ncclResult_t _ty_nccl = (expr);                                    \
    if (_ty_nccl != ncclSuccess && _ty_nccl != ncclInProgress) {       \
      return FromNccl(_ty_nccl, #expr, __FILE__, __LINE__, (context)); \
    }                                                                  \
  } while (0)

namespace {

enum CommIndex { kUp = 0, kDown = 1, kReduce = 2, kNumComms = 3 };
const char* const kCommNames[kNumComms] = {"up", "down", "reduce"};

class NcclTransportImpl final : public NcclTransport {
 public:
  explicit NcclTransportImpl(const NcclTransportOptions& options)
      : options_(options),
        where_(absl::StrCat("nccl transport (job \"", options.job_id,
                            "\", rank ", options.rank,
                            ", cuda:", options.device, ")")) {}

  ~NcclTransportImpl() override;

  // Creates streams, buffers and the communicators from `ids` (one per
  // CommIndex), then warms the neighbour links up. Bounded by `deadline`.
  absl::Status Init(const ncclUniqueId* ids, absl::Time deadline);

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  void SetComputeStream(CUstream_st* stream) override { compute_ = stream; }

  absl::Status Send(int peer, Message message) override;
  absl::StatusOr<Message> Recv(int peer, absl::Duration timeout) override;
  absl::Status AllReduceSum(std::vector<double>* values,
                            absl::Duration timeout) override;
  void Abort(const absl::Status& reason) override;

 private:
  struct PendingSend {
    cudaEvent_t done = nullptr;
    Message message;  // keeps the source tensors alive until `done`
    std::string header;
  };

  // Held by the rank's thread for the length of each call. Abort takes it
  // with TryLock, so the communicators are aborted either by Abort itself
  // or by the call in progress on its way out.
  class CallScope {
   public:
    explicit CallScope(NcclTransportImpl* t) : t_(t) { t_->call_mu_.Lock(); }
    ~CallScope() {
      t_->call_mu_.Unlock();
      t_->AbortCommsIfRequested();
    }

   private:
    NcclTransportImpl* t_;
  };

  absl::Status CheckUsable(int peer, absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  absl::Status AbortedStatus();
  // Records `status` as the abort reason (first one wins), aborts the
  // communicators, and returns `status`.
  absl::Status Fail(absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  void AbortComms() ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  void AbortCommsIfRequested();
  // The first asynchronous error of any communicator, if one has failed.
  absl::Status CommErrors(absl::string_view waiting_for)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  // Polls until `comm`'s last call is no longer in progress.
  absl::Status WaitComm(int comm, absl::Time deadline, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  // Polls until `event` has completed.
  absl::Status WaitEvent(cudaEvent_t event, absl::Time deadline,
                         absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  absl::Status ReapSends() ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  absl::Status EnsurePinned(int dir, size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  absl::Status WarmUp(absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  // Send's parts: where each CPU tensor goes in the device staging buffer
  // after the header (InvalidArgument for a tensor on another device), and
  // keeping the message alive until the stream is done with it.
  absl::StatusOr<std::vector<size_t>> StagingOffsets(const Message& message,
                                                     const std::string& what,
                                                     size_t* staged);
  absl::Status TrackSend(Message message, std::string header,
                         cudaStream_t stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  // Recv's parts: the header from `peer`, then its tensors into *message.
  absl::StatusOr<NcclHeader> RecvHeader(int peer, int dir, absl::Time deadline,
                                        absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  absl::Status RecvPayload(int peer, int dir, const NcclHeader& header,
                           absl::Time deadline, Message* message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);
  // ncclAllReduce of `values` on the reduce communicator (see
  // transport/nccl_transport.h for why not transport/collectives.h).
  absl::Status AllReduceLocked(std::vector<double>* values, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_);

  const NcclTransportOptions options_;
  const std::string where_;

  absl::Mutex call_mu_;
  ncclComm_t comms_[kNumComms] ABSL_GUARDED_BY(call_mu_) = {};
  bool comms_aborted_ ABSL_GUARDED_BY(call_mu_) = false;
  cudaStream_t streams_[kNumComms] = {};
  cudaStream_t compute_ = nullptr;  // legacy default stream until set
  cudaEvent_t compute_ready_ = nullptr;
  cudaEvent_t recv_ready_[2] = {};  // per direction
  cudaEvent_t reduce_ready_ = nullptr;
  void* header_dev_[2] = {};  // per direction, kNcclHeaderBytes
  void* pinned_[2] = {};      // per direction: header + payload staging
  size_t pinned_size_[2] = {};
  void* reduce_dev_ = nullptr;
  void* reduce_pinned_ = nullptr;
  size_t reduce_capacity_ = 0;  // doubles
  std::deque<PendingSend> pending_ ABSL_GUARDED_BY(call_mu_);

  std::atomic<bool> abort_requested_{false};
  absl::Mutex mu_;
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
};

absl::Status NcclTransportImpl::AbortedStatus() {
  absl::MutexLock lock(&mu_);
  return absl::AbortedError(abort_status_.message());
}

absl::Status NcclTransportImpl::Fail(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (abort_status_.ok()) abort_status_ = status;
  }
  abort_requested_.store(true);
  AbortComms();
  return status;
}

void NcclTransportImpl::AbortComms() {
  if (comms_aborted_) return;
  comms_aborted_ = true;
  for (ncclComm_t& c : comms_) {
    if (c != nullptr) ncclCommAbort(c);  // frees the communicator
    c = nullptr;
  }
}

void NcclTransportImpl::AbortCommsIfRequested() {
  if (!abort_requested_.load()) return;
  if (call_mu_.TryLock()) {
    AbortComms();
    call_mu_.Unlock();
  }
}

void NcclTransportImpl::Abort(const absl::Status& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (abort_status_.ok()) {
      abort_status_ =
          reason.ok() ? absl::AbortedError(absl::StrCat(where_, ": aborted"))
                      : reason;
    }
  }
  abort_requested_.store(true);
  AbortCommsIfRequested();
}

absl::Status NcclTransportImpl::CheckUsable(int peer, absl::string_view op) {
  if (abort_requested_.load()) {
    AbortComms();
    return AbortedStatus();
  }
  if (peer != -1 &&
      (peer < 0 || peer >= options_.world_size || peer == options_.rank)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where_, ": cannot ", op, " rank ", peer, " of ", options_.world_size));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), where_);
  return ReapSends();
}

absl::Status NcclTransportImpl::CommErrors(absl::string_view waiting_for) {
  for (int i = 0; i < kNumComms; ++i) {
    if (comms_[i] == nullptr) continue;
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comms_[i], &async);
    if (r != ncclSuccess) async = r;
    if (async != ncclSuccess && async != ncclInProgress) {
      return absl::UnavailableError(absl::StrCat(
          where_, ": NCCL communicator \"", kCommNames[i], "\" failed while ",
          waiting_for, ": ", ncclGetErrorString(async), " (",
          ncclGetLastError(comms_[i]), "); a peer rank is probably gone"));
    }
  }
  return absl::OkStatus();
}

namespace {
// Spin briefly (latency of small messages), then back off to 1 ms.
void PollPause(int iteration) {
  if (iteration < 200) return;
  absl::SleepFor(iteration < 2000 ? absl::Microseconds(20)
                                  : absl::Milliseconds(1));
}
}  // namespace

absl::Status NcclTransportImpl::WaitComm(int comm, absl::Time deadline,
                                         absl::string_view what) {
  for (int i = 0;; ++i) {
    if (abort_requested_.load()) {
      AbortComms();
      return AbortedStatus();
    }
    if (options_.cancel != nullptr && options_.cancel->load()) {
      return Fail(absl::CancelledError(absl::StrCat(
          where_, ": ", what, " on communicator \"", kCommNames[comm],
          "\": the job was cancelled; communicators aborted")));
    }
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comms_[comm], &async);
    if (r != ncclSuccess) async = r;
    if (async == ncclSuccess) return absl::OkStatus();
    if (async != ncclInProgress) {
      return Fail(absl::UnavailableError(
          absl::StrCat(where_, ": ", what, " on communicator \"",
                       kCommNames[comm], "\": ", ncclGetErrorString(async),
                       " (", ncclGetLastError(comms_[comm]), ")")));
    }
    if (absl::Now() > deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          where_, ": ", what, " on communicator \"", kCommNames[comm],
          "\" still in progress at its deadline; communicators aborted")));
    }
    PollPause(i);
  }
}

absl::Status NcclTransportImpl::WaitEvent(cudaEvent_t event,
                                          absl::Time deadline,
                                          absl::string_view what) {
  for (int i = 0;; ++i) {
    if (abort_requested_.load()) {
      AbortComms();
      return AbortedStatus();
    }
    cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      return Fail(
          CudaErrorToStatus(e, "cudaEventQuery", __FILE__, __LINE__,
                            absl::StrCat(where_, ": waiting for ", what)));
    }
    absl::Status comm = CommErrors(absl::StrCat("waiting for ", what));
    if (!comm.ok()) return Fail(comm);
    if (absl::Now() > deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          where_, ": ", what, " did not complete by its deadline; the NCCL ",
          "communicators are aborted (a posted NCCL operation cannot be "
          "cancelled)")));
    }
    PollPause(i);
  }
}

absl::Status NcclTransportImpl::ReapSends() {
  while (!pending_.empty()) {
    cudaError_t e = cudaEventQuery(pending_.front().done);
    if (e == cudaErrorNotReady) break;
    if (e != cudaSuccess) {
      return Fail(CudaErrorToStatus(e, "cudaEventQuery", __FILE__, __LINE__,
                                    absl::StrCat(where_, ": an earlier send")));
    }
    cudaEventDestroy(pending_.front().done);
    pending_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status NcclTransportImpl::EnsurePinned(int dir, size_t bytes) {
  if (pinned_size_[dir] >= bytes) return absl::OkStatus();
  if (pinned_[dir] != nullptr) {
    CUDA_RETURN_IF_ERROR(cudaFreeHost(pinned_[dir]), where_);
    pinned_[dir] = nullptr;
    pinned_size_[dir] = 0;
  }
  const size_t size = std::max(bytes, 2 * pinned_size_[dir]);
  CUDA_RETURN_IF_ERROR(cudaMallocHost(&pinned_[dir], size), where_);
  pinned_size_[dir] = size;
  return absl::OkStatus();
}

absl::Status NcclTransportImpl::Init(const ncclUniqueId* ids,
                                     absl::Time deadline) {
  absl::MutexLock lock(&call_mu_);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), where_);
  for (int i = 0; i < kNumComms; ++i) {
    CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&streams_[i], cudaStreamNonBlocking), where_);
  }
  for (cudaEvent_t* e :
       {&compute_ready_, &recv_ready_[0], &recv_ready_[1], &reduce_ready_}) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(e, cudaEventDisableTiming),
                         where_);
  }
  for (int d = 0; d < 2; ++d) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(&header_dev_[d], kNcclHeaderBytes), where_);
    RETURN_IF_ERROR(EnsurePinned(d, kNcclHeaderBytes));
  }
  // Communicators are created one after the other, in the same order on
  // every rank, each awaited before the next.
  for (int i = 0; i < kNumComms; ++i) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    NCCL_RETURN_IF_ERROR(ncclCommInitRankConfig(&comms_[i], options_.world_size,
                                                ids[i], options_.rank, &config),
                         where_);
    absl::Status st = WaitComm(
        i, deadline,
        absl::StrCat("joining (not every one of the ", options_.world_size,
                     " ranks joined within the init timeout)"));
    if (!st.ok()) return st;
  }
  return WarmUp(deadline);
}

absl::Status NcclTransportImpl::WarmUp(absl::Time deadline) {
  // One byte to and from each neighbour on each direction communicator,
  // then one all-reduce: connects the links a pipeline uses and checks that
  // every rank is alive.
  const int r = options_.rank, n = options_.world_size;
  for (int dir : {kUp, kDown}) {
    const int to = dir == kUp ? r + 1 : r - 1;
    const int from = dir == kUp ? r - 1 : r + 1;
    char* buf = static_cast<char*>(header_dev_[dir]);
    NCCL_RETURN_IF_ERROR(ncclGroupStart(), where_);
    if (to >= 0 && to < n) {
      NCCL_RETURN_IF_ERROR(
          ncclSend(buf, 1, ncclUint8, to, comms_[dir], streams_[dir]), where_);
    }
    if (from >= 0 && from < n) {
      NCCL_RETURN_IF_ERROR(
          ncclRecv(buf + 1, 1, ncclUint8, from, comms_[dir], streams_[dir]),
          where_);
    }
    NCCL_RETURN_IF_ERROR(ncclGroupEnd(), where_);
    RETURN_IF_ERROR(WaitComm(dir, deadline, "warm-up exchange"));
  }
  std::vector<double> one = {1.0};
  RETURN_IF_ERROR(AllReduceLocked(&one, deadline));
  for (int dir : {kUp, kDown}) {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(streams_[dir]), where_);
  }
  if (one[0] != static_cast<double>(n)) {
    return absl::InternalError(absl::StrCat(where_,
                                            ": warm-up all-reduce of 1.0 over ",
                                            n, " ranks gave ", one[0]));
  }
  return absl::OkStatus();
}

absl::Status NcclTransportImpl::Send(int peer, Message message) {
  CallScope scope(this);
  RETURN_IF_ERROR(CheckUsable(peer, "send to"));
  const int dir = peer > options_.rank ? kUp : kDown;
  const std::string what = absl::StrCat(
      "send of ", MessageKindName(message.kind), " step ", message.step,
      " microbatch ", message.microbatch, " to rank ", peer);
  ASSIGN_OR_RETURN(std::string header, EncodeNcclHeader(message));
  cudaStream_t stream = streams_[dir];
  ncclComm_t comm = comms_[dir];
  const absl::Time enqueue_deadline = absl::Now() + options_.payload_timeout;

  // Staging: the header and every CPU tensor, in one device buffer.
  size_t staged = kNcclHeaderBytes;
  ASSIGN_OR_RETURN(const std::vector<size_t> offsets,
                   StagingOffsets(message, what, &staged));

  // Communication waits for the kernels already queued on the compute
  // stream, without blocking the host.
  CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_ready_, compute_), where_);
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, compute_ready_, 0), where_);
  char* buf = nullptr;
  CUDA_RETURN_IF_ERROR(
      cudaMallocAsync(reinterpret_cast<void**>(&buf), staged, stream), where_);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buf, header.data(), kNcclHeaderBytes,
                                       cudaMemcpyHostToDevice, stream),
                       where_);
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    const Tensor& t = message.tensors[i].second;
    if (t.device().is_cpu() && t.nbytes() > 0) {
      CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(buf + offsets[i], t.raw_data(), t.nbytes(),
                          cudaMemcpyHostToDevice, stream),
          where_);
    }
  }
  // The header travels alone: the receiver must read it before it can post
  // the payload receives.
  NCCL_RETURN_IF_ERROR(
      ncclSend(buf, kNcclHeaderBytes, ncclUint8, peer, comm, stream), where_);
  RETURN_IF_ERROR(WaitComm(dir, enqueue_deadline, what));
  NCCL_RETURN_IF_ERROR(ncclGroupStart(), where_);
  for (size_t i = 0; i < message.tensors.size(); ++i) {
    const Tensor& t = message.tensors[i].second;
    if (t.nbytes() == 0) continue;
    const void* src = t.device().is_cpu() ? buf + offsets[i] : t.ptr();
    NCCL_RETURN_IF_ERROR(
        ncclSend(src, t.nbytes(), ncclUint8, peer, comm, stream), where_);
  }
  NCCL_RETURN_IF_ERROR(ncclGroupEnd(), where_);
  RETURN_IF_ERROR(WaitComm(dir, enqueue_deadline, what));
  CUDA_RETURN_IF_ERROR(cudaFreeAsync(buf, stream), where_);
  return TrackSend(std::move(message), std::move(header), stream);
}

absl::StatusOr<std::vector<size_t>> NcclTransportImpl::StagingOffsets(
    const Message& message, const std::string& what, size_t* staged) {
  std::vector<size_t> offsets;
  for (const auto& [name, t] : message.tensors) {
    if (!t.device().is_cpu() && t.device() != Device::Cuda(options_.device)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where_, ": ", what, ": tensor \"", name, "\" is on ",
                       t.device().ToString(), ", not on this rank's device"));
    }
    offsets.push_back(*staged);
    if (t.device().is_cpu()) *staged += (t.nbytes() + 255) / 256 * 256;
  }
  return offsets;
}

absl::Status NcclTransportImpl::TrackSend(Message message, std::string header,
                                          cudaStream_t stream) {
  PendingSend pending;
  CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&pending.done, cudaEventDisableTiming), where_);
  pending.message = std::move(message);
  pending.header = std::move(header);
  cudaError_t e = cudaEventRecord(pending.done, stream);
  if (e != cudaSuccess) {
    cudaEventDestroy(pending.done);
    return CudaErrorToStatus(e, "cudaEventRecord(send done)", __FILE__,
                             __LINE__, where_);
  }
  pending_.push_back(std::move(pending));
  return absl::OkStatus();
}

absl::StatusOr<Message> NcclTransportImpl::Recv(int peer,
                                                absl::Duration timeout) {
  CallScope scope(this);
  RETURN_IF_ERROR(CheckUsable(peer, "receive from"));
  const absl::Time deadline = absl::Now() + timeout;
  const int dir = peer < options_.rank ? kUp : kDown;
  ASSIGN_OR_RETURN(const NcclHeader header,
                   RecvHeader(peer, dir, deadline, timeout));
  Message message;
  message.kind = header.kind;
  message.step = header.step;
  message.microbatch = header.microbatch;
  message.chunk = header.chunk;
  if (header.payload_bytes > 0) {
    const absl::Time payload_deadline =
        std::max(deadline, absl::Now() + options_.payload_timeout);
    RETURN_IF_ERROR(RecvPayload(peer, dir, header, payload_deadline, &message));
  } else {
    for (const TensorDesc& d : header.tensors) {
      message.tensors.emplace_back(d.name, Tensor::Empty(d.dtype, d.shape));
    }
  }
  // Later kernels on the compute stream see the received data.
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_, recv_ready_[dir], 0),
                       where_);
  return message;
}

absl::StatusOr<NcclHeader> NcclTransportImpl::RecvHeader(
    int peer, int dir, absl::Time deadline, absl::Duration timeout) {
  cudaStream_t stream = streams_[dir];
  const std::string from = absl::StrCat("message from rank ", peer);
  NCCL_RETURN_IF_ERROR(ncclRecv(header_dev_[dir], kNcclHeaderBytes, ncclUint8,
                                peer, comms_[dir], stream),
                       where_);
  RETURN_IF_ERROR(WaitComm(dir, deadline, absl::StrCat("header of ", from)));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(pinned_[dir], header_dev_[dir], kNcclHeaderBytes,
                      cudaMemcpyDeviceToHost, stream),
      where_);
  CUDA_RETURN_IF_ERROR(cudaEventRecord(recv_ready_[dir], stream), where_);
  {
    absl::Status st =
        WaitEvent(recv_ready_[dir], deadline, absl::StrCat("header of ", from));
    if (st.code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(absl::StrCat(
          where_, ": no message from rank ", peer, " within ",
          absl::FormatDuration(timeout), "; communicators aborted"));
    }
    RETURN_IF_ERROR(st);
  }
  absl::StatusOr<NcclHeader> header = DecodeNcclHeader(absl::string_view(
      static_cast<const char*>(pinned_[dir]), kNcclHeaderBytes));
  if (!header.ok()) {
    // The stream is out of step with the peer; nothing later can be trusted.
    return Fail(absl::DataLossError(
        absl::StrCat(where_, ": ", from, ": ", header.status().message())));
  }
  return header;
}

absl::Status NcclTransportImpl::RecvPayload(int peer, int dir,
                                            const NcclHeader& header,
                                            absl::Time deadline,
                                            Message* message) {
  cudaStream_t stream = streams_[dir];
  const std::string what = absl::StrCat("payload of message from rank ", peer);
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const TensorDesc& d : header.tensors) {
    offsets.push_back(total);
    total += (d.nbytes() + 255) / 256 * 256;
  }
  RETURN_IF_ERROR(EnsurePinned(dir, total));
  char* buf = nullptr;
  CUDA_RETURN_IF_ERROR(
      cudaMallocAsync(reinterpret_cast<void**>(&buf), total, stream), where_);
  NCCL_RETURN_IF_ERROR(ncclGroupStart(), where_);
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const size_t n = header.tensors[i].nbytes();
    if (n == 0) continue;
    NCCL_RETURN_IF_ERROR(
        ncclRecv(buf + offsets[i], n, ncclUint8, peer, comms_[dir], stream),
        where_);
  }
  NCCL_RETURN_IF_ERROR(ncclGroupEnd(), where_);
  RETURN_IF_ERROR(WaitComm(dir, deadline, what));
  // Until Tensor has device storage, results come back to host memory.
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(pinned_[dir], buf, total, cudaMemcpyDeviceToHost, stream),
      where_);
  CUDA_RETURN_IF_ERROR(cudaFreeAsync(buf, stream), where_);
  CUDA_RETURN_IF_ERROR(cudaEventRecord(recv_ready_[dir], stream), where_);
  RETURN_IF_ERROR(WaitEvent(recv_ready_[dir], deadline, what));
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const TensorDesc& d = header.tensors[i];
    Tensor t = Tensor::Empty(d.dtype, d.shape);
    if (t.nbytes() > 0) {
      std::memcpy(t.raw_data(), static_cast<char*>(pinned_[dir]) + offsets[i],
                  t.nbytes());
    }
    message->tensors.emplace_back(d.name, std::move(t));
  }
  return absl::OkStatus();
}

absl::Status NcclTransportImpl::AllReduceSum(std::vector<double>* values,
                                             absl::Duration timeout) {
  CallScope scope(this);
  RETURN_IF_ERROR(CheckUsable(-1, "all-reduce with"));
  return AllReduceLocked(values, absl::Now() + timeout);
}

absl::Status NcclTransportImpl::AllReduceLocked(std::vector<double>* values,
                                                absl::Time deadline) {
  const size_t n = values->size();
  if (n == 0) return absl::OkStatus();
  if (reduce_capacity_ < n) {
    if (reduce_dev_ != nullptr) {
      CUDA_RETURN_IF_ERROR(cudaFree(reduce_dev_), where_);
      CUDA_RETURN_IF_ERROR(cudaFreeHost(reduce_pinned_), where_);
      reduce_dev_ = reduce_pinned_ = nullptr;
      reduce_capacity_ = 0;
    }
    const size_t cap = std::max<size_t>(n, 64);
    CUDA_RETURN_IF_ERROR(cudaMalloc(&reduce_dev_, cap * sizeof(double)),
                         where_);
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&reduce_pinned_, cap * sizeof(double)),
                         where_);
    reduce_capacity_ = cap;
  }
  cudaStream_t stream = streams_[kReduce];
  std::memcpy(reduce_pinned_, values->data(), n * sizeof(double));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(reduce_dev_, reduce_pinned_, n * sizeof(double),
                      cudaMemcpyHostToDevice, stream),
      where_);
  NCCL_RETURN_IF_ERROR(ncclAllReduce(reduce_dev_, reduce_dev_, n, ncclDouble,
                                     ncclSum, comms_[kReduce], stream),
                       where_);
  const std::string what = absl::StrCat("all-reduce of ", n, " doubles");
  RETURN_IF_ERROR(WaitComm(kReduce, deadline, what));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(reduce_pinned_, reduce_dev_, n * sizeof(double),
                      cudaMemcpyDeviceToHost, stream),
      where_);
  CUDA_RETURN_IF_ERROR(cudaEventRecord(reduce_ready_, stream), where_);
  RETURN_IF_ERROR(WaitEvent(reduce_ready_, deadline, what));
  std::memcpy(values->data(), reduce_pinned_, n * sizeof(double));
  return absl::OkStatus();
}

NcclTransportImpl::~NcclTransportImpl() {
  absl::MutexLock lock(&call_mu_);
  if (cudaSetDevice(options_.device) != cudaSuccess) return;  // nothing usable
  const absl::Time deadline = absl::Now() + options_.shutdown_timeout;
  if (!abort_requested_.load()) {
    // Let queued sends finish, then finalize (flushes NCCL's own work).
    bool ok = true;
    for (PendingSend& p : pending_) {
      ok = ok && WaitEvent(p.done, deadline, "a queued send at shutdown").ok();
    }
    for (int i = 0; ok && i < kNumComms; ++i) {
      if (comms_[i] == nullptr) continue;
      const ncclResult_t r = ncclCommFinalize(comms_[i]);
      ok = (r == ncclSuccess || r == ncclInProgress) &&
           WaitComm(i, deadline, "finalize").ok();
    }
    if (ok) {
      for (ncclComm_t& c : comms_) {
        if (c != nullptr) ncclCommDestroy(c);
        c = nullptr;
      }
    }
  }
  AbortComms();  // no-op when destroyed above
  for (PendingSend& p : pending_) cudaEventDestroy(p.done);
  for (cudaStream_t& s : streams_) {
    if (s != nullptr) cudaStreamDestroy(s);
  }
  for (cudaEvent_t e :
       {compute_ready_, recv_ready_[0], recv_ready_[1], reduce_ready_}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (int d = 0; d < 2; ++d) {
    if (header_dev_[d] != nullptr) cudaFree(header_dev_[d]);
    if (pinned_[d] != nullptr) cudaFreeHost(pinned_[d]);
  }
  if (reduce_dev_ != nullptr) cudaFree(reduce_dev_);
  if (reduce_pinned_ != nullptr) cudaFreeHost(reduce_pinned_);
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclTransport>> CreateNcclTransport(
    const NcclTransportOptions& options) {
  RETURN_IF_ERROR(ValidateNcclTransportOptions(options));
  const std::string where =
      absl::StrCat("nccl transport (job \"", options.job_id, "\", rank ",
                   options.rank, ", cuda:", options.device, ")");
  const absl::Time deadline = absl::Now() + options.init_timeout;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": no CUDA device: cudaGetDeviceCount: ",
                     e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)));
  }
  if (options.device >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": device: cuda:", options.device,
        " does not exist; this machine has ", count, " CUDA device(s)"));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device), where);

  ncclUniqueId ids[kNumComms];
  const std::string key = absl::StrCat(options.job_id, "/nccl_id");
  if (options.rank == 0) {
    for (ncclUniqueId& id : ids)
      NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id), where);
    RETURN_IF_ERROR(options.rendezvous->Put(
        key, std::string(reinterpret_cast<const char*>(ids), sizeof(ids))));
  } else {
    absl::StatusOr<std::string> got =
        options.rendezvous->Get(key, deadline - absl::Now());
    if (!got.ok()) {
      return absl::Status(got.status().code(),
                          absl::StrCat(where, ": ", got.status().message()));
    }
    if (got->size() != sizeof(ids)) {
      return absl::DataLossError(absl::StrCat(
          where, ": rendezvous key \"", key, "\" holds ", got->size(),
          " bytes, expected ", sizeof(ids), " (", kNumComms, " NCCL ids)"));
    }
    std::memcpy(ids, got->data(), sizeof(ids));
  }
  auto transport = std::make_unique<NcclTransportImpl>(options);
  absl::Status init = transport->Init(ids, deadline);
  if (!init.ok()) {
    transport->Abort(init);  // the destructor then aborts, not finalizes
    return init;
  }
  return std::unique_ptr<NcclTransport>(std::move(transport));
}

#endif  // TRAINYARD_HAVE_NCCL

}  // namespace trainyard
