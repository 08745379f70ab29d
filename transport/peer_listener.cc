#include "transport/peer_listener.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "net/address.h"
#include "net/poll_server.h"
#include "transport/frame.h"
#include "transport/tcp_handshake.h"

namespace trainyard {
namespace {

// A pending connection's leftover bytes are read and dropped, up to this
// many, before it is closed: closing with unread data would reset the
// connection, and the dialer could lose the rejection's reason.
constexpr size_t kMaxDiscardedBytes = 4096;

// All pending handshakes run on the PollServer's thread: each connection
// in its handshake is a small state machine (Pending) with its own
// deadline, polled beside the listening socket and the wakeup that
// Register signals. Nothing blocks: sockets are non-blocking and a
// rejection is written with one send() that may fall short.
class HandshakeServer final : public RegisteringPeerListener,
                              private PollServer::Handler {
 public:
  HandshakeServer(Fd fd, std::string address,
                  const PeerListenerOptions& options, int max_pending)
      : address_(std::move(address)),
        options_(options),
        max_pending_(max_pending) {
    PollServer::Handler* handler = this;
    server_ = std::make_unique<PollServer>(
        std::move(fd), absl::StrCat("listener ", address_), handler);
  }

  // Pending connections close, unanswered.
  ~HandshakeServer() override { server_.reset(); }

  std::string address() const override { return address_; }

  absl::StatusOr<std::shared_ptr<PeerRegistration>> Register(
      const std::string& job_id, int rank, int world_size,
      const std::string& secret) override;
  void Unregister(const std::shared_ptr<PeerRegistration>& reg) override;

 private:
  // One connection in its handshake. Only the server's thread touches it.
  struct Pending {
    enum class State {
      kHello,         // reading the hello (prefix, then nonce and job id)
      kRegistration,  // waiting up to unknown_job_timeout for (job, to_rank)
      kProof,         // challenge sent (or being sent); reading the proof
      kAccepting,     // writing the accept; then the fd goes to `reg`
    };
    Fd fd;
    std::string peer;  // the dialer's address
    State state = State::kHello;
    absl::Time deadline;
    std::string in;                      // the message being read, so far
    size_t want = kHandshakePrefixSize;  // its size, as far as known
    Handshake hello;
    std::string who;  // "rank 1 of job "j" for rank 0", once the hello is in
    std::shared_ptr<PeerRegistration> reg;  // from the challenge on
    std::string listener_nonce;
    std::string out;  // the challenge or the accept
    size_t written = 0;
    bool finished = false;  // closed or handed over; dropped from the loop
  };
  using State = Pending::State;

  // PollServer::Handler.
  void OnAccept(Fd conn, const sockaddr_in& from) override;
  void PreparePoll(absl::Time now, std::vector<pollfd>* fds,
                   absl::Time* wake_by) override;
  void OnPolled(absl::Span<const pollfd> fds) override;
  void OnWake() override;

  // Drops the finished connections.
  void Sweep();
  // Reads what has arrived of the current message; acts on each complete
  // one.
  void Read(Pending* p);
  // Acts on a complete message: `p->in` holds `p->want` bytes.
  void Complete(Pending* p);
  // A connection whose hello is in: once its (job, to_rank) has registered,
  // checks the ranks and sends the challenge.
  void Route(Pending* p);
  // The proof is in: only a dialer that holds the secret gets further.
  void CheckProof(Pending* p);
  // Writes what it can of `p->out`; once an accept is out, hands the
  // connection over.
  void Flush(Pending* p);
  // Hands an accepted connection to its registration.
  void HandOver(Pending* p);
  // A deadline passed.
  void Expire(Pending* p);
  // Logs why, sends the rejection with one non-blocking send (best effort:
  // a dialer that does not read loses it), and closes.
  void Reject(Pending* p, const std::string& reason);
  // Logs why and closes the connection, dropping what it sent unread.
  void Close(Pending* p, const std::string& reason);

  const std::string address_;
  const PeerListenerOptions options_;
  const int max_pending_;  // options_.max_pending_handshakes, fd-limited
  absl::Mutex mu_;
  std::map<std::pair<std::string, int>, std::shared_ptr<PeerRegistration>>
      registry_ ABSL_GUARDED_BY(mu_);
  // Only the server's thread.
  std::vector<std::unique_ptr<Pending>> pending_;
  int64_t refused_ = 0;  // closed at the cap
  // Last: its thread stops before the members above go.
  std::unique_ptr<PollServer> server_;
};

absl::StatusOr<std::shared_ptr<PeerRegistration>> HandshakeServer::Register(
    const std::string& job_id, int rank, int world_size,
    const std::string& secret) {
  std::shared_ptr<PeerRegistration> reg;
  {
    absl::MutexLock lock(&mu_);
    auto& slot = registry_[{job_id, rank}];
    if (slot != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrCat("listener ", address_, ": job \"", job_id, "\" rank ",
                       rank, " is already connecting through it"));
    }
    slot = std::make_shared<PeerRegistration>(job_id, rank, world_size, secret);
    reg = slot;
  }
  server_->Wake();  // handshakes waiting for it go on
  return reg;
}

void HandshakeServer::Unregister(const std::shared_ptr<PeerRegistration>& reg) {
  {
    absl::MutexLock lock(&reg->mu);
    reg->closed = true;
  }
  absl::MutexLock lock(&mu_);
  auto it = registry_.find({reg->job_id, reg->rank});
  if (it != registry_.end() && it->second == reg) registry_.erase(it);
}

// Over the cap, connections are closed unread: a flood of idle connections
// costs a descriptor each until its handshake deadline, and no more.
void HandshakeServer::OnAccept(Fd conn, const sockaddr_in& from) {
  if (static_cast<int>(pending_.size()) >= max_pending_) {
    if (refused_++ % 1000 == 0) {
      LOG(WARNING) << "listener " << address_ << ": " << max_pending_
                   << " handshakes pending; closing the connection from "
                   << SockaddrToString(from) << " (" << refused_
                   << " closed so far)";
    }
    return;
  }
  SetNoDelayAndNonBlocking(conn.get());
  auto p = std::make_unique<Pending>();
  p->fd = std::move(conn);
  p->peer = SockaddrToString(from);
  p->deadline = absl::Now() + options_.handshake_timeout;
  Read(p.get());  // the hello may be there already
  pending_.push_back(std::move(p));
}

void HandshakeServer::PreparePoll(absl::Time now, std::vector<pollfd>* fds,
                                  absl::Time* wake_by) {
  for (auto& p : pending_) {
    if (now >= p->deadline) Expire(p.get());
  }
  Sweep();
  for (const auto& p : pending_) {
    short events = 0;
    if (p->state == State::kHello || p->state == State::kProof) {
      events |= POLLIN;
    }
    if (p->written < p->out.size()) events |= POLLOUT;
    fds->push_back({p->fd.get(), events, 0});
    *wake_by = std::min(*wake_by, p->deadline);
  }
}

void HandshakeServer::OnPolled(absl::Span<const pollfd> fds) {
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending* p = pending_[i].get();
    const short revents = fds[i].revents;
    if (revents == 0 || p->finished) continue;
    if (revents & POLLOUT) Flush(p);
    if (p->finished) continue;
    if (p->state == State::kHello || p->state == State::kProof) {
      if (revents & (POLLIN | POLLHUP | POLLERR)) Read(p);
    } else if (p->state == State::kRegistration &&
               (revents & (POLLHUP | POLLERR))) {
      Close(p, absl::StrCat(p->who,
                            ": the dialer closed the connection while it "
                            "waited for that job/rank to register"));
    } else if (p->state == State::kAccepting) {
      Flush(p);  // reports the error
    }
  }
  Sweep();
}

void HandshakeServer::OnWake() {
  for (auto& p : pending_) {
    if (p->state == State::kRegistration) Route(p.get());
  }
}

void HandshakeServer::Sweep() {
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [](const std::unique_ptr<Pending>& p) {
                                  return p->finished;
                                }),
                 pending_.end());
}

void HandshakeServer::Read(Pending* p) {
  while (!p->finished &&
         (p->state == State::kHello || p->state == State::kProof)) {
    if (p->in.size() == p->want) {
      Complete(p);
      continue;
    }
    const size_t have = p->in.size();
    p->in.resize(p->want);
    const ssize_t r = ::recv(p->fd.get(), &p->in[have], p->want - have, 0);
    const int err = errno;
    p->in.resize(have + std::max<ssize_t>(r, 0));
    if (r > 0) continue;
    if (r < 0 && err == EINTR) continue;
    if (r < 0 && (err == EAGAIN || err == EWOULDBLOCK)) return;
    const std::string what =
        r == 0 ? std::string("connection closed") : ErrnoText(err);
    if (p->state == State::kHello) {
      Reject(p, absl::StrCat("handshake: ", what, " after ", have, " of ",
                             p->want, " bytes"));
    } else {
      Reject(p, absl::StrCat(p->who, ": handshake: ", what,
                             " before the proof (got ", have, " of ", p->want,
                             " bytes)"));
    }
  }
}

void HandshakeServer::Complete(Pending* p) {
  if (p->state == State::kProof) {
    CheckProof(p);
    return;
  }
  if (p->want == kHandshakePrefixSize) {
    uint16_t job_len = 0;
    absl::StatusOr<Handshake> hs =
        DecodeHandshakePrefix(p->in.data(), &job_len);
    if (!hs.ok()) {
      Reject(p, std::string(hs.status().message()));
      return;
    }
    p->hello = *std::move(hs);
    p->want = kHandshakePrefixSize + HandshakeRestSize(job_len);
    return;
  }
  const absl::Status s = DecodeHandshakeRest(
      absl::string_view(p->in).substr(kHandshakePrefixSize), &p->hello);
  if (!s.ok()) {
    Reject(p, std::string(s.message()));
    return;
  }
  // Escaped: the job id comes from an unauthenticated peer and goes into
  // logs.
  p->who = absl::StrCat("rank ", p->hello.from_rank, " of job \"",
                        absl::CHexEscape(p->hello.job_id), "\" for rank ",
                        p->hello.to_rank);
  p->state = State::kRegistration;
  p->deadline = absl::Now() + options_.unknown_job_timeout;
  Route(p);
}

void HandshakeServer::Route(Pending* p) {
  std::shared_ptr<PeerRegistration> reg;
  {
    absl::MutexLock lock(&mu_);
    auto it = registry_.find({p->hello.job_id, p->hello.to_rank});
    if (it == registry_.end()) return;  // still waiting
    reg = it->second;
  }
  std::string reason;
  {
    absl::MutexLock lock(&reg->mu);
    const int world = static_cast<int>(reg->accepted.size());
    if (reg->closed) {
      reason = "that transport is no longer accepting connections";
    } else if (p->hello.from_rank <= reg->rank || p->hello.from_rank >= world) {
      reason = absl::StrCat("from-rank must be in (", reg->rank, ", ", world,
                            ") (higher ranks dial lower ones)");
    }
  }
  if (!reason.empty()) {
    Reject(p, absl::StrCat(p->who, ": ", reason));
    return;
  }
  p->reg = std::move(reg);
  p->listener_nonce = NewHandshakeNonce();
  p->state = State::kProof;
  p->deadline = absl::Now() + options_.handshake_timeout;
  p->in.clear();
  p->want = kHandshakeProofSize;
  p->out =
      EncodeHandshakeReply(HandshakeReplyCode::kChallenge, p->listener_nonce);
  p->written = 0;
  Flush(p);
}

void HandshakeServer::CheckProof(Pending* p) {
  absl::StatusOr<std::string> mac = DecodeHandshakeProof(p->in.data());
  const std::string failed =
      absl::StrCat(p->who, ": data-plane authentication failed");
  if (!mac.ok()) {
    Reject(p, absl::StrCat(failed, ": ", mac.status().message()));
    return;
  }
  PeerRegistration& reg = *p->reg;
  if (!HandshakeMacMatches(HandshakeMac(reg.secret, HandshakeRole::kDialer,
                                        p->hello, p->listener_nonce),
                           *mac)) {
    Reject(p, absl::StrCat(failed, " (wrong or missing job secret)"));
    return;
  }
  const int from = p->hello.from_rank;
  std::string reason;
  {
    absl::MutexLock lock(&reg.mu);
    if (reg.closed) {
      reason = "that transport is no longer accepting connections";
    } else if (reg.accepted[from].valid() || reg.accepting[from]) {
      reason = "duplicate connection";
    } else {
      reg.accepting[from] = true;
    }
  }
  if (!reason.empty()) {
    Reject(p, absl::StrCat(p->who, ": ", reason));
    return;
  }
  p->state = State::kAccepting;
  p->deadline = absl::Now() + options_.handshake_timeout;
  p->out =
      EncodeHandshakeReply(HandshakeReplyCode::kAccepted,
                           HandshakeMac(reg.secret, HandshakeRole::kListener,
                                        p->hello, p->listener_nonce));
  p->written = 0;
  Flush(p);
}

void HandshakeServer::Flush(Pending* p) {
  while (p->written < p->out.size()) {
    const ssize_t w = ::send(p->fd.get(), p->out.data() + p->written,
                             p->out.size() - p->written, MSG_NOSIGNAL);
    if (w > 0) {
      p->written += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    Close(p, absl::StrCat(p->who.empty() ? "handshake" : p->who,
                          ": cannot answer the handshake: ",
                          w < 0 ? ErrnoText(errno) : "send returned 0"));
    return;
  }
  if (p->state == State::kAccepting) HandOver(p);
}

void HandshakeServer::HandOver(Pending* p) {
  PeerRegistration& reg = *p->reg;
  bool handed = false;
  {
    absl::MutexLock lock(&reg.mu);
    reg.accepting[p->hello.from_rank] = false;
    if (!reg.closed) {
      reg.accepted[p->hello.from_rank] = std::move(p->fd);
      handed = true;
    }
  }
  if (!handed) {
    LOG(WARNING) << "listener " << address_ << ": " << p->who
                 << ": accepted, but that transport stopped accepting "
                    "connections meanwhile; closing it";
  }
  p->fd.Reset();
  p->finished = true;
}

void HandshakeServer::Expire(Pending* p) {
  switch (p->state) {
    case State::kHello:
      Reject(p, absl::StrCat("handshake: timed out after ", p->in.size(),
                             " of ", p->want, " bytes"));
      return;
    case State::kRegistration:
      Reject(p, absl::StrCat(
                    p->who,
                    ": no such job/rank registered with this listener within ",
                    absl::FormatDuration(options_.unknown_job_timeout)));
      return;
    case State::kProof:
      Reject(p, absl::StrCat(
                    p->who, ": handshake: no proof of the job secret within ",
                    absl::FormatDuration(options_.handshake_timeout), " (got ",
                    p->in.size(), " of ", p->want, " bytes)"));
      return;
    case State::kAccepting:
      Close(p, absl::StrCat(p->who,
                            ": cannot answer the handshake: timed out "
                            "writing the accept"));
      return;
  }
}

void HandshakeServer::Reject(Pending* p, const std::string& reason) {
  const std::string reply =
      EncodeHandshakeReply(HandshakeReplyCode::kRejected, reason);
  const ssize_t w = ::send(p->fd.get(), reply.data(), reply.size(),
                           MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)w;
  Close(p, reason);
}

void HandshakeServer::Close(Pending* p, const std::string& reason) {
  LOG(WARNING) << "listener " << address_ << ": closing connection from "
               << p->peer << ": " << reason;
  if (p->state == State::kAccepting) {
    absl::MutexLock lock(&p->reg->mu);
    p->reg->accepting[p->hello.from_rank] = false;
  }
  char sink[kMaxDiscardedBytes];
  (void)::recv(p->fd.get(), sink, sizeof(sink), MSG_DONTWAIT);
  p->fd.Reset();
  p->finished = true;
}

// Pending handshakes hold a descriptor each: at most half of the process's
// limit, leaving the rest to everything else (transports, gRPC, files).
int PendingHandshakeCap(const std::string& address, int requested) {
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0 ||
      nofile.rlim_cur == RLIM_INFINITY ||
      nofile.rlim_cur / 2 >= static_cast<rlim_t>(requested)) {
    return requested;
  }
  const int cap = std::max(1, static_cast<int>(nofile.rlim_cur / 2));
  LOG(INFO) << "listener " << address << ": at most " << cap
            << " pending handshakes (half the descriptor limit "
            << nofile.rlim_cur << "), not " << requested;
  return cap;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PeerListener>> PeerListener::Listen(
    const std::string& address) {
  return Listen(address, PeerListenerOptions());
}

absl::StatusOr<std::unique_ptr<PeerListener>> PeerListener::Listen(
    const std::string& address, const PeerListenerOptions& options) {
  if (options.max_pending_handshakes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen on ", address, ": max_pending_handshakes must be >= 1, got ",
        options.max_pending_handshakes));
  }
  ASSIGN_OR_RETURN(sockaddr_in sa, ResolveIpv4(address));
  absl::StatusOr<Fd> fd = ListenTcp(&sa, SOMAXCONN, /*failure=*/nullptr);
  if (!fd.ok()) return Prefixed(fd.status(), "listen on " + address + ": ");
  const std::string bound = SockaddrToString(sa);
  const int max_pending =
      PendingHandshakeCap(bound, options.max_pending_handshakes);
  return std::unique_ptr<PeerListener>(
      new HandshakeServer(*std::move(fd), bound, options, max_pending));
}

}  // namespace trainyard
