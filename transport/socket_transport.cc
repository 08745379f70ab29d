#include "transport/socket_transport.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "glog/logging.h"
#include "transport/collectives.h"
#include "transport/frame.h"
#include "transport/frame_stream.h"

namespace trainyard {
namespace {

// Abort waits at most this long for a frame in flight to a peer, and again
// for its abort frame to be written.
constexpr absl::Duration kAbortWriteTimeout = absl::Milliseconds(200);

// A sender whose write failed waits at most this long for the receiver to
// report the peer's abort frame, the cause, before it reports its own
// error, a symptom.
constexpr absl::Duration kWriteErrorGrace = absl::Milliseconds(200);

Tensor DoublesToTensor(const std::vector<double>& v) {
  Tensor t = Tensor::Empty(DType::kFloat64, {static_cast<int64_t>(v.size())});
  if (!v.empty()) {
    std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(double));
  }
  return t;
}

// An all-reduce message as a frame's kind and tensor.
std::pair<FrameKind, std::pair<std::string, Tensor>> ReduceMessageToFrame(
    const ReduceMessage& m) {
  switch (m.kind) {
    case ReduceMessage::Kind::kContribution:
      return {FrameKind::kAllReduceContribution,
              {"values", DoublesToTensor(m.values)}};
    case ReduceMessage::Kind::kResult:
      return {FrameKind::kAllReduceResult,
              {"values", DoublesToTensor(m.values)}};
    case ReduceMessage::Kind::kError:
      break;
  }
  // The receivers reject longer ones (CheckFrameContent).
  const size_t len =
      std::min(m.error.size(), static_cast<size_t>(kMaxAbortMessageLength));
  Tensor msg = Tensor::Empty(DType::kUInt8, {static_cast<int64_t>(len)});
  if (len > 0) std::memcpy(msg.raw_data(), m.error.data(), len);
  return {FrameKind::kAllReduceError, {"message", std::move(msg)}};
}

// A frame of kind 16-18, checked by CheckFrameContent, as the all-reduce
// message it carries.
ReduceMessage ReduceMessageFromFrame(const Frame& f) {
  ReduceMessage m;
  m.round = f.header.prefix.step;
  const Tensor& t = f.tensors[0];
  if (f.header.prefix.kind == FrameKind::kAllReduceError) {
    m.kind = ReduceMessage::Kind::kError;
    m.error.assign(static_cast<const char*>(t.raw_data()), t.nbytes());
    return m;
  }
  m.kind = f.header.prefix.kind == FrameKind::kAllReduceContribution
               ? ReduceMessage::Kind::kContribution
               : ReduceMessage::Kind::kResult;
  const double* v = static_cast<const double*>(t.raw_data());
  m.values.assign(v, v + t.numel());
  return m;
}

class SocketTransport final : public Transport, private ReducePeers {
 public:
  SocketTransport(const SocketTransportOptions& options,
                  std::vector<Fd> sockets);
  // Flushes the queued frames and says goodbye unless the transport failed.
  ~SocketTransport() override;

  int rank() const override { return options_.rank; }
  int world_size() const override { return static_cast<int>(peers_.size()); }
  absl::Status Send(int peer, Message message) override;
  absl::StatusOr<Message> Recv(int peer, absl::Duration timeout) override;
  absl::Status AllReduceSum(std::vector<double>* values,
                            absl::Duration timeout) override {
    return RankOrderedAllReduceSum(rank(), world_size(), this, values, timeout);
  }
  void Abort(const absl::Status& reason) override;
  int64_t payload_bytes_sent() const override { return bytes_sent_.load(); }
  int64_t payload_bytes_received() const override {
    return bytes_received_.load();
  }

 private:
  struct Outgoing {
    FrameKind kind;
    std::string header;
    std::vector<Tensor> tensors;
  };
  struct Peer {
    int rank = 0;
    std::string name;  // "rank 2 (127.0.0.1:40123)"
    Fd fd;
    std::thread sender, receiver;
    std::deque<Outgoing> outbox;  // guarded by the transport's mu_
    std::deque<Frame> inbox;      // user messages
    std::deque<Frame> reduce_inbox;
    bool said_goodbye = false;
    // The sender thread is in the middle of a frame.
    bool writing = false;
    // No more frames may go on the socket: a write failed or was cut short,
    // the goodbye went out, or the abort frame did.
    bool write_closed = false;
  };

  // ReducePeers (transport/collectives.h).
  absl::StatusOr<int64_t> StartReduceRound() override {
    return reduce_round_++;
  }
  absl::Status SendReduce(int peer, ReduceMessage message) override;
  absl::StatusOr<ReduceMessage> RecvReduce(int peer, int64_t round,
                                           absl::Time deadline,
                                           absl::Duration timeout) override;
  absl::Status FailReduceRound(int64_t round,
                               const std::string& reason) override;

  absl::Status CheckPeer(int peer, const char* what) const;
  absl::Status Enqueue(int peer, Outgoing out,
                       const std::vector<std::pair<std::string, Tensor>>& ts);
  // Pops the next frame from `peer` (user or all-reduce queue).
  absl::StatusOr<Frame> Take(int peer, bool reduce, absl::Time deadline,
                             absl::Duration timeout);
  // Records the first connection error and stops every thread; pending and
  // later calls return it.
  void Fail(Peer* p, const absl::Status& s);
  void SetFatal(const absl::Status& s);

  // Sender thread.
  void SendLoop(Peer* p);
  // Waits for the next frame to send; false once the transport failed.
  bool NextOutgoing(Peer* p, Outgoing* out);
  absl::Status WriteOutgoing(Peer* p, Outgoing* out);
  void ReportWriteError(Peer* p, FrameKind kind, const absl::Status& s);

  // Receiver thread.
  void ReceiveLoop(Peer* p);
  // A frame that is not for this transport's job or not what its kind
  // promises.
  absl::Status CheckReceived(const Peer* p, const Frame& f) const;
  // Queues or acts on a checked frame; false when the peer is done (an
  // abort or a goodbye).
  bool Deliver(Peer* p, Frame f);

  // Abort's parts: records the reason and picks the peers whose sockets
  // are between frames (false when an abort is under way already); then
  // writes them the abort frame.
  bool ClaimAbort(const absl::Status& reason, std::vector<Peer*>* tell);
  void TellAbort(const std::vector<Peer*>& tell, const absl::Status& reason);

  const SocketTransportOptions options_;
  PollSignal stop_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank; null for ours
  int64_t reduce_round_ = 0;                  // only the caller's thread
  absl::Mutex mu_;
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  bool abort_started_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
};

SocketTransport::SocketTransport(const SocketTransportOptions& options,
                                 std::vector<Fd> sockets)
    : options_(options), peers_(options.peer_addresses.size()) {
  for (size_t r = 0; r < peers_.size(); ++r) {
    if (static_cast<int>(r) == options_.rank) continue;
    auto p = std::make_unique<Peer>();
    p->rank = static_cast<int>(r);
    p->name = absl::StrCat("rank ", r, " (", options_.peer_addresses[r], ")");
    p->fd = std::move(sockets[r]);
    peers_[r] = std::move(p);
  }
  for (auto& p : peers_) {
    if (p == nullptr) continue;
    Peer* peer = p.get();
    peer->sender = std::thread([this, peer] { SendLoop(peer); });
    peer->receiver = std::thread([this, peer] { ReceiveLoop(peer); });
  }
}

SocketTransport::~SocketTransport() {
  {
    absl::MutexLock lock(&mu_);
    if (fatal_.ok()) {
      for (auto& p : peers_) {
        if (p != nullptr) p->outbox.push_back(Outgoing{FrameKind::kGoodbye});
      }
    }
  }
  for (auto& p : peers_) {
    if (p != nullptr) p->sender.join();
  }
  stop_.Signal();
  for (auto& p : peers_) {
    if (p != nullptr) p->receiver.join();
  }
}

absl::Status SocketTransport::Send(int peer, Message message) {
  RETURN_IF_ERROR(CheckPeer(peer, "send to"));
  Outgoing out{static_cast<FrameKind>(message.kind)};
  absl::StatusOr<std::string> header =
      EncodeFrameHeader(out.kind, options_.job_id, message.step,
                        message.microbatch, message.chunk, message.tensors);
  if (!header.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options_.rank, ": send to rank ", peer, ": ",
                     header.status().message()));
  }
  out.header = *std::move(header);
  return Enqueue(peer, std::move(out), message.tensors);
}

absl::StatusOr<Message> SocketTransport::Recv(int peer,
                                              absl::Duration timeout) {
  RETURN_IF_ERROR(CheckPeer(peer, "receive from"));
  ASSIGN_OR_RETURN(Frame frame, Take(peer, /*reduce=*/false,
                                     absl::Now() + timeout, timeout));
  Message m;
  m.kind = static_cast<MessageKind>(frame.header.prefix.kind);
  m.step = frame.header.prefix.step;
  m.microbatch = frame.header.prefix.microbatch;
  m.chunk = frame.header.prefix.chunk;
  for (size_t i = 0; i < frame.tensors.size(); ++i) {
    m.tensors.emplace_back(std::move(frame.header.tensors[i].name),
                           std::move(frame.tensors[i]));
  }
  return m;
}

void SocketTransport::Abort(const absl::Status& reason) {
  std::vector<Peer*> tell;
  if (!ClaimAbort(reason, &tell)) return;
  TellAbort(tell, reason);
  stop_.Signal();
  for (auto& p : peers_) {
    if (p != nullptr) ::shutdown(p->fd.get(), SHUT_RDWR);
  }
}

bool SocketTransport::ClaimAbort(const absl::Status& reason,
                                 std::vector<Peer*>* tell) {
  absl::MutexLock lock(&mu_);
  if (fatal_.ok()) {
    fatal_ = absl::AbortedError(reason.ok() ? "aborted" : reason.message());
  }
  // The first Abort tells the peers and closes the sockets; a later one
  // (e.g. the stage failing because of the first) must not cut its frames
  // short.
  if (abort_started_) return false;
  abort_started_ = true;
  // With fatal_ set no sender starts another frame; give the ones in the
  // middle of a frame a moment to finish so that the abort frame starts on
  // a frame boundary. A stuck one is not waited for.
  auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& p : peers_) {
      if (p != nullptr && p->writing && !p->write_closed) return false;
    }
    return true;
  };
  mu_.AwaitWithTimeout(absl::Condition(&idle), kAbortWriteTimeout);
  for (auto& p : peers_) {
    if (p == nullptr || p->writing || p->write_closed || p->said_goodbye) {
      continue;
    }
    p->write_closed = true;
    tell->push_back(p.get());
  }
  return true;
}

void SocketTransport::TellAbort(const std::vector<Peer*>& tell,
                                const absl::Status& reason) {
  const std::vector<std::pair<std::string, Tensor>> ts =
      AbortFrameTensors(reason);
  const std::vector<Tensor> tensors = {ts[0].second, ts[1].second};
  const absl::StatusOr<std::string> header =
      EncodeFrameHeader(FrameKind::kAbort, options_.job_id, 0, 0, 0, ts);
  for (Peer* p : tell) {
    // No stop fd: a connection error on another peer must not cut this
    // frame short.
    const absl::Status s =
        WriteFrame(p->fd.get(), *header, tensors,
                   absl::Now() + kAbortWriteTimeout, /*stop_fd=*/-1);
    if (!s.ok()) {
      LOG(WARNING) << "job \"" << options_.job_id << "\" rank " << options_.rank
                   << ": cannot tell " << p->name
                   << " about the abort: " << s.message();
    }
  }
}

absl::Status SocketTransport::SendReduce(int peer, ReduceMessage message) {
  auto [kind, tensor] = ReduceMessageToFrame(message);
  const std::vector<std::pair<std::string, Tensor>> ts = {std::move(tensor)};
  Outgoing out{kind};
  ASSIGN_OR_RETURN(out.header, EncodeFrameHeader(kind, options_.job_id,
                                                 message.round, 0, 0, ts));
  return Enqueue(peer, std::move(out), ts);
}

absl::StatusOr<ReduceMessage> SocketTransport::RecvReduce(
    int peer, int64_t round, absl::Time deadline, absl::Duration timeout) {
  ASSIGN_OR_RETURN(const Frame f,
                   Take(peer, /*reduce=*/true, deadline, timeout));
  return ReduceMessageFromFrame(f);
}

// Tells every other rank why, in an all-reduce-error frame; the transport
// stays usable.
absl::Status SocketTransport::FailReduceRound(int64_t round,
                                              const std::string& reason) {
  for (int r = 1; r < world_size(); ++r) {
    SendReduce(r, {ReduceMessage::Kind::kError, round, {}, reason})
        .IgnoreError();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(ReduceRoundName(rank(), round), ": ", reason));
}

absl::Status SocketTransport::CheckPeer(int peer, const char* what) const {
  if (peer < 0 || peer >= world_size() || peer == options_.rank) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank,
                                                   ": cannot ", what, " rank ",
                                                   peer, " of ", world_size()));
  }
  return absl::OkStatus();
}

absl::Status SocketTransport::Enqueue(
    int peer, Outgoing out,
    const std::vector<std::pair<std::string, Tensor>>& ts) {
  for (const auto& [name, t] : ts) out.tensors.push_back(t);
  absl::MutexLock lock(&mu_);
  if (!fatal_.ok()) return fatal_;
  Peer* p = peers_[peer].get();
  if (p->said_goodbye) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", options_.rank, ": cannot send to ", p->name,
                     ": it closed its transport"));
  }
  p->outbox.push_back(std::move(out));
  return absl::OkStatus();
}

absl::StatusOr<Frame> SocketTransport::Take(int peer, bool reduce,
                                            absl::Time deadline,
                                            absl::Duration timeout) {
  Peer* p = peers_[peer].get();
  std::deque<Frame>& q = reduce ? p->reduce_inbox : p->inbox;
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !q.empty() || !fatal_.ok() || p->said_goodbye;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("rank ", options_.rank, ": no ",
                     reduce ? "all-reduce message" : "message", " from ",
                     p->name, " within ", absl::FormatDuration(timeout)));
  }
  if (!fatal_.ok()) return fatal_;
  if (q.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", options_.rank, ": ", p->name,
                     " closed its transport; no more messages will come"));
  }
  Frame f = std::move(q.front());
  q.pop_front();
  return f;
}

void SocketTransport::Fail(Peer* p, const absl::Status& s) {
  SetFatal(absl::Status(s.code(), absl::StrCat(p->name, ": ", s.message())));
}

void SocketTransport::SetFatal(const absl::Status& s) {
  absl::MutexLock lock(&mu_);
  if (!fatal_.ok()) return;
  fatal_ = s;
  LOG(WARNING) << "job \"" << options_.job_id << "\" rank " << options_.rank
               << ": " << fatal_.message();
  stop_.Signal();
}

void SocketTransport::SendLoop(Peer* p) {
  Outgoing out;
  while (NextOutgoing(p, &out)) {
    const absl::Status s = WriteOutgoing(p, &out);
    if (!s.ok()) {
      if (!absl::IsCancelled(s)) ReportWriteError(p, out.kind, s);
      return;
    }
    for (const Tensor& t : out.tensors) {
      bytes_sent_.fetch_add(static_cast<int64_t>(t.nbytes()));
    }
    if (out.kind == FrameKind::kGoodbye) {
      ::shutdown(p->fd.get(), SHUT_WR);
      return;
    }
  }
}

bool SocketTransport::NextOutgoing(Peer* p, Outgoing* out) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !p->outbox.empty() || !fatal_.ok();
  };
  mu_.Await(absl::Condition(&ready));
  if (!fatal_.ok()) return false;
  *out = std::move(p->outbox.front());
  p->outbox.pop_front();
  p->writing = true;
  return true;
}

absl::Status SocketTransport::WriteOutgoing(Peer* p, Outgoing* out) {
  if (out->kind == FrameKind::kGoodbye) {
    absl::StatusOr<std::string> h =
        EncodeFrameHeader(FrameKind::kGoodbye, options_.job_id, 0, 0, 0, {});
    out->header = *h;
  }
  const absl::Status s =
      WriteFrame(p->fd.get(), out->header, out->tensors,
                 absl::Now() + options_.io_timeout, stop_.fd());
  absl::MutexLock lock(&mu_);
  p->writing = false;
  // A frame cut short leaves the stream unusable for an abort frame.
  if (!s.ok() || out->kind == FrameKind::kGoodbye) p->write_closed = true;
  return s;
}

void SocketTransport::ReportWriteError(Peer* p, FrameKind kind,
                                       const absl::Status& s) {
  // A peer that aborted sent its reason just before closing; the receive
  // loop may still be reading it. Give it a moment to be the first error
  // (the cause) rather than this broken pipe (a symptom).
  {
    absl::MutexLock lock(&mu_);
    auto failed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !fatal_.ok();
    };
    mu_.AwaitWithTimeout(absl::Condition(&failed), kWriteErrorGrace);
  }
  Fail(p, absl::Status(s.code(), absl::StrCat("sending a ", FrameKindName(kind),
                                              " frame: ", s.message())));
}

void SocketTransport::ReceiveLoop(Peer* p) {
  while (true) {
    absl::StatusOr<Frame> f =
        ReadFrame(p->fd.get(), options_.io_timeout, stop_.fd());
    if (!f.ok()) {
      if (!absl::IsCancelled(f.status())) Fail(p, f.status());
      return;
    }
    for (const Tensor& t : f->tensors) {
      bytes_received_.fetch_add(static_cast<int64_t>(t.nbytes()));
    }
    if (absl::Status s = CheckReceived(p, *f); !s.ok()) {
      Fail(p, s);
      return;
    }
    if (!Deliver(p, *std::move(f))) return;
  }
}

absl::Status SocketTransport::CheckReceived(const Peer* p,
                                            const Frame& f) const {
  if (f.header.job_id != options_.job_id) {
    return absl::DataLossError(absl::StrCat(
        "received a frame for job \"", f.header.job_id,
        "\"; this transport serves job \"", options_.job_id, "\""));
  }
  return CheckFrameContent(f.header, f.tensors, options_.rank, p->rank);
}

bool SocketTransport::Deliver(Peer* p, Frame f) {
  if (f.header.prefix.kind == FrameKind::kAbort) {
    absl::StatusOr<AbortReason> why = DecodeAbortFrame(f.header, f.tensors);
    if (!why.ok()) {
      Fail(p, why.status());
    } else {
      SetFatal(absl::Status(why->code,
                            absl::StrCat(p->name, " aborted: ", why->message)));
    }
    return false;
  }
  absl::MutexLock lock(&mu_);
  switch (f.header.prefix.kind) {
    case FrameKind::kGoodbye:
      p->said_goodbye = true;
      return false;
    case FrameKind::kAllReduceContribution:
    case FrameKind::kAllReduceResult:
    case FrameKind::kAllReduceError:
      p->reduce_inbox.push_back(std::move(f));
      return true;
    default:
      p->inbox.push_back(std::move(f));
      return true;
  }
}

}  // namespace

std::unique_ptr<Transport> NewSocketTransport(
    const SocketTransportOptions& options, std::vector<Fd> sockets) {
  return std::make_unique<SocketTransport>(options, std::move(sockets));
}

}  // namespace trainyard
