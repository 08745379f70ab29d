#include "transport/tcp_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "core/crc32c.h"
#include "transport/frame.h"
#include "net/address.h"
#include "core/status_macros.h"
#include "transport/tcp_handshake.h"
#include "glog/logging.h"

namespace trainyard {
namespace {

// Frames are written and read in pieces of this size; the CRC of a piece is
// computed right before it is written (or right after it is read), while
// it is still in cache.
constexpr size_t kChunk = 256 << 10;

// Abort waits at most this long for a frame in flight to a peer, and again
// for its abort frame to be written.
constexpr absl::Duration kAbortWriteTimeout = absl::Milliseconds(200);

// Connection setup looks at TcpTransportOptions::cancel this often.
constexpr absl::Duration kCancelPollInterval = absl::Milliseconds(50);

// Closes the descriptor it owns.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

std::string ErrnoText(int err) { return std::strerror(err); }

// An eventfd that, once signalled, stays readable until Clear(): every
// poll() that includes it wakes up.
class StopSignal {
 public:
  StopSignal() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    CHECK(fd_.valid()) << "eventfd: " << ErrnoText(errno);
  }
  void Signal() {
    uint64_t one = 1;
    ssize_t n = ::write(fd_.get(), &one, sizeof(one));
    (void)n;  // fails only when the counter would overflow: already set
  }
  // Makes it unreadable again (for use as a wakeup, not a stop).
  void Clear() {
    uint64_t count;
    ssize_t n = ::read(fd_.get(), &count, sizeof(count));
    (void)n;  // EAGAIN: not signalled
  }
  int fd() const { return fd_.get(); }

 private:
  Fd fd_;
};

std::string SockaddrToString(const sockaddr_in& sa) {
  char host[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &sa.sin_addr, host, sizeof(host));
  return absl::StrCat(host, ":", ntohs(sa.sin_port));
}

void SetConnectionOptions(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Keepalive and user timeout from `options` (validated) on a connection.
absl::Status SetLivenessOptions(int fd, const TcpTransportOptions& options) {
  const int on = 1;
  const int idle =
      static_cast<int>(absl::ToInt64Seconds(options.keepalive_idle));
  const int interval =
      static_cast<int>(absl::ToInt64Seconds(options.keepalive_interval));
  const int count = options.keepalive_count;
  const unsigned int user_timeout = static_cast<unsigned int>(
      absl::ToInt64Milliseconds(options.tcp_user_timeout));
  struct {
    int level, name;
    const void* value;
    const char* what;
  } const settings[] = {
      {SOL_SOCKET, SO_KEEPALIVE, &on, "SO_KEEPALIVE"},
      {IPPROTO_TCP, TCP_KEEPIDLE, &idle, "TCP_KEEPIDLE"},
      {IPPROTO_TCP, TCP_KEEPINTVL, &interval, "TCP_KEEPINTVL"},
      {IPPROTO_TCP, TCP_KEEPCNT, &count, "TCP_KEEPCNT"},
      {IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, "TCP_USER_TIMEOUT"},
  };
  for (const auto& o : settings) {
    if (o.name == TCP_USER_TIMEOUT && user_timeout == 0) continue;
    if (::setsockopt(fd, o.level, o.name, o.value, sizeof(int)) != 0) {
      return absl::InternalError(
          absl::StrCat("setsockopt ", o.what, ": ", ErrnoText(errno)));
    }
  }
  return absl::OkStatus();
}

int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return 1000;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  // Round up so that we do not spin on sub-millisecond remainders.
  return static_cast<int>(
      std::min<int64_t>(1000, absl::ToInt64Milliseconds(left) + 1));
}

// Waits until `fd` has `events` (POLLIN or POLLOUT). Returns
// DeadlineExceeded after `deadline`, Cancelled when `stop_fd` fires.
absl::Status WaitFd(int fd, short events, absl::Time deadline, int stop_fd) {
  while (true) {
    pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int n = ::poll(fds, stop_fd >= 0 ? 2 : 1, PollTimeoutMs(deadline));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("poll: ", ErrnoText(errno)));
    }
    if (stop_fd >= 0 && (fds[1].revents & POLLIN)) {
      return absl::CancelledError("transport is shutting down");
    }
    if (fds[0].revents != 0) return absl::OkStatus();  // ready, HUP or error
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("timed out");
    }
  }
}

// True once `stop_fd` (a StopSignal's, or -1 for none) has fired.
bool Stopped(int stop_fd) {
  if (stop_fd < 0) return false;
  pollfd p = {stop_fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

// Sleeps for `d` unless `stop_fd` fires first; true if it did.
bool SleepUnlessStopped(absl::Duration d, int stop_fd) {
  if (stop_fd < 0) {
    absl::SleepFor(d);
    return false;
  }
  const absl::Time deadline = absl::Now() + d;
  while (true) {
    const absl::Status s = WaitFd(stop_fd, POLLIN, deadline, -1);
    if (s.ok()) return true;
    if (absl::IsDeadlineExceeded(s)) return false;
    // poll failed: fall back to a plain sleep for what is left.
    absl::SleepFor(std::max(absl::ZeroDuration(), deadline - absl::Now()));
    return Stopped(stop_fd);
  }
}

// Reads exactly `n` bytes into `buf`. *got counts the bytes read. EOF is
// Unavailable ("connection closed"); a socket error is Unavailable with its
// text.
absl::Status ReadFull(int fd, char* buf, size_t n, absl::Time deadline,
                      int stop_fd, size_t* got) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::recv(fd, buf + done, n - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
      *got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return absl::UnavailableError("connection closed");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(ErrnoText(errno));
    }
    RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, stop_fd));
  }
  return absl::OkStatus();
}

// Writes every byte of `iov` (modified in place).
absl::Status WriteAll(int fd, std::vector<iovec>* iov, absl::Time deadline,
                      int stop_fd) {
  size_t first = 0;
  while (first < iov->size()) {
    msghdr msg{};
    msg.msg_iov = iov->data() + first;
    msg.msg_iovlen = std::min<size_t>(iov->size() - first, IOV_MAX);
    const ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, stop_fd));
        continue;
      }
      return absl::UnavailableError(ErrnoText(errno));
    }
    size_t left = static_cast<size_t>(w);
    while (left > 0) {
      iovec& v = (*iov)[first];
      if (left >= v.iov_len) {
        left -= v.iov_len;
        ++first;
      } else {
        v.iov_base = static_cast<char*>(v.iov_base) + left;
        v.iov_len -= left;
        left = 0;
      }
    }
    while (first < iov->size() && (*iov)[first].iov_len == 0) ++first;
  }
  return absl::OkStatus();
}

absl::Status WriteString(int fd, const std::string& s, absl::Time deadline,
                         int stop_fd) {
  std::vector<iovec> iov = {{const_cast<char*>(s.data()), s.size()}};
  return WriteAll(fd, &iov, deadline, stop_fd);
}

// Writes one frame: header, the tensors' bytes straight from their
// storage, CRC32C trailer.
absl::Status WriteFrame(int fd, const std::string& header,
                        const std::vector<Tensor>& tensors, absl::Time deadline,
                        int stop_fd) {
  uint32_t crc = Crc32cExtend(0, header.data(), header.size());
  std::vector<iovec> batch = {
      {const_cast<char*>(header.data()), header.size()}};
  size_t batch_bytes = header.size();
  for (const Tensor& t : tensors) {
    const char* p = static_cast<const char*>(t.raw_data());
    size_t n = t.nbytes();
    while (n > 0) {
      const size_t take =
          std::min(n, kChunk - std::min(batch_bytes, kChunk - 1));
      crc = Crc32cExtend(crc, p, take);
      batch.push_back({const_cast<char*>(p), take});
      batch_bytes += take;
      p += take;
      n -= take;
      if (batch_bytes >= kChunk) {
        RETURN_IF_ERROR(WriteAll(fd, &batch, deadline, stop_fd));
        batch.clear();
        batch_bytes = 0;
      }
    }
  }
  char trailer[kFrameTrailerSize];
  std::memcpy(trailer, &crc, sizeof(crc));
  batch.push_back({trailer, sizeof(trailer)});
  return WriteAll(fd, &batch, deadline, stop_fd);
}

struct Frame {
  FrameHeader header;
  std::vector<Tensor> tensors;
};

// Reads one frame. Waits for its first byte until `stop_fd` fires; the
// rest must arrive within `io_timeout`. Errors say what went wrong, without
// naming the peer (the caller does).
absl::StatusOr<Frame> ReadFrame(int fd, absl::Duration io_timeout,
                                int stop_fd) {
  char prefix_bytes[kFramePrefixSize];
  size_t got = 0;
  // The first byte may take as long as the peer likes.
  absl::Status s =
      ReadFull(fd, prefix_bytes, 1, absl::InfiniteFuture(), stop_fd, &got);
  if (!s.ok()) {
    if (absl::IsUnavailable(s) && got == 0 &&
        s.message() == "connection closed") {
      return absl::UnavailableError(
          "connection closed by the peer between frames (no goodbye: the "
          "peer process died or aborted)");
    }
    return s;
  }
  const absl::Time deadline = absl::Now() + io_timeout;
  auto mid_frame = [&](const absl::Status& s, uint64_t total) -> absl::Status {
    const std::string of = total == 0 ? std::string("a frame prefix of ") +
                                            std::to_string(kFramePrefixSize)
                                      : std::to_string(total);
    if (absl::IsCancelled(s)) return s;
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "frame not complete within ", absl::FormatDuration(io_timeout),
          " (got ", got, " of ", of, " bytes)"));
    }
    if (s.message() == "connection closed") {
      return absl::UnavailableError(
          absl::StrCat("connection closed in the middle of a frame (got ", got,
                       " of ", of, " bytes)"));
    }
    return absl::UnavailableError(
        absl::StrCat(s.message(), " (got ", got, " of ", of, " bytes)"));
  };
  s = ReadFull(fd, prefix_bytes + 1, kFramePrefixSize - 1, deadline, stop_fd,
               &got);
  if (!s.ok()) return mid_frame(s, 0);
  ASSIGN_OR_RETURN(const FramePrefix prefix, DecodeFramePrefix(prefix_bytes));
  const uint64_t total =
      prefix.header_size + prefix.payload_size + kFrameTrailerSize;
  std::string rest(prefix.header_size - kFramePrefixSize, '\0');
  s = ReadFull(fd, rest.data(), rest.size(), deadline, stop_fd, &got);
  if (!s.ok()) return mid_frame(s, total);
  Frame frame;
  ASSIGN_OR_RETURN(frame.header, DecodeFrameHeader(prefix, rest));
  uint32_t crc = Crc32cExtend(0, prefix_bytes, kFramePrefixSize);
  crc = Crc32cExtend(crc, rest.data(), rest.size());
  for (const TensorDesc& d : frame.header.tensors) {
    absl::StatusOr<Tensor> created = Tensor::Create(d.dtype, d.shape);
    if (!created.ok()) return mid_frame(created.status(), total);
    Tensor t = *std::move(created);
    char* p = static_cast<char*>(t.raw_data());
    size_t n = t.nbytes();
    while (n > 0) {
      const size_t take = std::min(n, kChunk);
      s = ReadFull(fd, p, take, deadline, stop_fd, &got);
      if (!s.ok()) return mid_frame(s, total);
      crc = Crc32cExtend(crc, p, take);
      p += take;
      n -= take;
    }
    frame.tensors.push_back(std::move(t));
  }
  uint32_t expected;
  s = ReadFull(fd, reinterpret_cast<char*>(&expected), sizeof(expected),
               deadline, stop_fd, &got);
  if (!s.ok()) return mid_frame(s, total);
  if (expected != crc) {
    return absl::DataLossError(absl::StrFormat(
        "checksum mismatch in a %s frame of %d bytes (crc32c 0x%08x, trailer "
        "says 0x%08x)",
        FrameKindName(prefix.kind), total, crc, expected));
  }
  return frame;
}

// Checks that a frame `from_rank` sent to `to_rank` carries the tensors its
// kind promises (docs/TRANSPORT_FRAME.md), so that nothing downstream has
// to: the codec has checked sizes and dtypes, not what each kind means.
// DataLoss saying what is wrong; the caller names the peer.
absl::Status CheckFrameContent(const Frame& f, int to_rank, int from_rank) {
  const FrameKind kind = f.header.prefix.kind;
  const std::vector<TensorDesc>& d = f.header.tensors;
  const std::string what =
      absl::StrCat("malformed ", FrameKindName(kind), " frame");
  auto describe = [&d] {
    if (d.empty()) return std::string("no tensors");
    std::vector<std::string> parts;
    for (const TensorDesc& t : d) {
      parts.push_back(absl::StrCat("\"", t.name, "\" ", DTypeName(t.dtype), " ",
                                   ShapeToString(t.shape)));
    }
    return absl::StrJoin(parts, ", ");
  };
  // Exactly one 1-d tensor `name` of `dtype`, at most `max_len` long.
  auto one_vector = [&](const char* name, DType dtype,
                        int64_t max_len) -> absl::Status {
    if (d.size() != 1 || f.tensors.size() != 1 || d[0].name != name ||
        d[0].dtype != dtype || d[0].shape.size() != 1) {
      return absl::DataLossError(absl::StrCat(what, ": expected one tensor \"",
                                              name, "\" ", DTypeName(dtype),
                                              " [n], got ", describe()));
    }
    if (d[0].shape[0] > max_len) {
      return absl::DataLossError(absl::StrCat(what, ": \"", name, "\" has ",
                                              d[0].shape[0],
                                              " elements, limit ", max_len));
    }
    return absl::OkStatus();
  };
  switch (kind) {
    case FrameKind::kActivation:
    case FrameKind::kGradient:
    case FrameKind::kEvalActivation:
    case FrameKind::kSnapshot:
      return absl::OkStatus();  // the message's own tensors
    case FrameKind::kAllReduceContribution:
      if (to_rank != 0) {
        return absl::DataLossError(
            absl::StrCat(what, " sent to rank ", to_rank,
                         ": only rank 0 gathers contributions"));
      }
      return one_vector("values", DType::kFloat64, INT64_MAX);
    case FrameKind::kAllReduceResult:
    case FrameKind::kAllReduceError:
      if (from_rank != 0) {
        return absl::DataLossError(absl::StrCat(what, " from rank ", from_rank,
                                                ": only rank 0 sends one"));
      }
      return kind == FrameKind::kAllReduceResult
                 ? one_vector("values", DType::kFloat64, INT64_MAX)
                 : one_vector("message", DType::kUInt8, kMaxAbortMessageLength);
    case FrameKind::kGoodbye:
      if (!d.empty()) {
        return absl::DataLossError(
            absl::StrCat(what, ": expected no tensors, got ", describe()));
      }
      return absl::OkStatus();
    case FrameKind::kAbort:
      return absl::OkStatus();  // DecodeAbortFrame checks it
  }
  return absl::DataLossError(
      absl::StrCat("unknown frame kind ", static_cast<int>(kind)));
}

// A listener registration: the connections accepted so far for one job
// rank, by the dialing rank, and the job secret their dialers must prove.
struct Registration {
  Registration(std::string job_id, int rank, int world_size, std::string secret)
      : job_id(std::move(job_id)),
        rank(rank),
        secret(std::move(secret)),
        accepted(world_size),
        accepting(world_size, false) {}
  const std::string job_id;
  const int rank;
  const std::string secret;
  absl::Mutex mu;
  std::vector<Fd> accepted ABSL_GUARDED_BY(mu);
  // The dialer of that rank has proved itself and its accept is being
  // written: another connection from it is a duplicate.
  std::vector<bool> accepting ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;
};

// A pending connection's leftover bytes are read and dropped, up to this
// many, before it is closed: closing with unread data would reset the
// connection, and the dialer could lose the rejection's reason.
constexpr size_t kMaxDiscardedBytes = 4096;

// New connections taken per loop iteration, so that a flood of connects
// cannot starve the handshakes already in progress.
constexpr int kMaxAcceptsPerRound = 64;

}  // namespace

// All pending handshakes run on one thread (HandshakeLoop): a poll() over
// the listening socket, a wakeup eventfd (Register) and every connection in
// its handshake, each a small state machine (Pending) with its own
// deadline. Nothing in the loop blocks: sockets are non-blocking and a
// rejection is written with one send() that may fall short.
class PeerListenerImpl : public PeerListener {
 public:
  PeerListenerImpl(Fd fd, std::string address,
                   const PeerListenerOptions& options, int max_pending)
      : fd_(std::move(fd)),
        address_(std::move(address)),
        options_(options),
        max_pending_(max_pending) {
    loop_thread_ = std::thread([this] { HandshakeLoop(); });
  }

  ~PeerListenerImpl() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    wake_.Signal();
    loop_thread_.join();
  }

  std::string address() const override { return address_; }

  absl::StatusOr<std::shared_ptr<Registration>> Register(
      const std::string& job_id, int rank, int world_size,
      const std::string& secret) {
    std::shared_ptr<Registration> reg;
    {
      absl::MutexLock lock(&mu_);
      auto& slot = registry_[{job_id, rank}];
      if (slot != nullptr) {
        return absl::AlreadyExistsError(
            absl::StrCat("listener ", address_, ": job \"", job_id, "\" rank ",
                         rank, " is already connecting through it"));
      }
      slot = std::make_shared<Registration>(job_id, rank, world_size, secret);
      reg = slot;
    }
    wake_.Signal();  // handshakes waiting for it go on
    return reg;
  }

  void Unregister(const std::shared_ptr<Registration>& reg) {
    {
      absl::MutexLock lock(&reg->mu);
      reg->closed = true;
    }
    absl::MutexLock lock(&mu_);
    auto it = registry_.find({reg->job_id, reg->rank});
    if (it != registry_.end() && it->second == reg) registry_.erase(it);
  }

 private:
  // One connection in its handshake. Only the loop thread touches it.
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
    std::shared_ptr<Registration> reg;  // from the challenge on
    std::string listener_nonce;
    std::string out;  // the challenge or the accept
    size_t written = 0;
    bool finished = false;  // closed or handed over; dropped from the loop
  };
  using State = Pending::State;

  void HandshakeLoop() {
    std::vector<std::unique_ptr<Pending>> pending;
    std::vector<pollfd> fds;
    absl::Time accept_paused_until = absl::InfinitePast();
    while (true) {
      const absl::Time now = absl::Now();
      for (auto& p : pending) {
        if (now >= p->deadline) Expire(p.get());
      }
      Sweep(&pending);
      const bool accepting = now >= accept_paused_until;
      absl::Time next =
          accepting ? absl::InfiniteFuture() : accept_paused_until;
      fds.clear();
      fds.push_back({wake_.fd(), POLLIN, 0});
      fds.push_back({accepting ? fd_.get() : -1, POLLIN, 0});  // -1: skipped
      for (const auto& p : pending) {
        short events = 0;
        if (p->state == State::kHello || p->state == State::kProof) {
          events |= POLLIN;
        }
        if (p->written < p->out.size()) events |= POLLOUT;
        // With no events, poll still reports POLLHUP and POLLERR.
        fds.push_back({p->fd.get(), events, 0});
        next = std::min(next, p->deadline);
      }
      if (::poll(fds.data(), fds.size(), PollTimeoutMs(next)) < 0) {
        if (errno != EINTR) {
          LOG(ERROR) << "listener " << address_
                     << ": poll: " << ErrnoText(errno);
          absl::SleepFor(absl::Milliseconds(10));
        }
        continue;
      }
      if (fds[0].revents & POLLIN) {
        wake_.Clear();
        {
          absl::MutexLock lock(&mu_);
          if (stopping_) return;  // pending connections close, unanswered
        }
        for (auto& p : pending) {
          if (p->state == State::kRegistration) Route(p.get());
        }
      }
      for (size_t i = 0; i < pending.size(); ++i) {
        Pending* p = pending[i].get();
        const short revents = fds[i + 2].revents;
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
      Sweep(&pending);
      if (fds[1].revents & POLLIN) Accept(&pending, &accept_paused_until);
    }
  }

  void Sweep(std::vector<std::unique_ptr<Pending>>* pending) {
    pending->erase(std::remove_if(pending->begin(), pending->end(),
                                  [](const std::unique_ptr<Pending>& p) {
                                    return p->finished;
                                  }),
                   pending->end());
  }

  // Takes the connections waiting in the backlog; over the cap they are
  // closed unread.
  void Accept(std::vector<std::unique_ptr<Pending>>* pending,
              absl::Time* paused_until) {
    for (int i = 0; i < kMaxAcceptsPerRound; ++i) {
      sockaddr_in from{};
      socklen_t len = sizeof(from);
      const int c = ::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&from),
                              &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        // Out of descriptors (EMFILE) or memory: the connection stays in the
        // backlog, and the socket stays readable; pause rather than spin.
        if (accept_errors_++ % 100 == 0) {
          LOG(WARNING) << "listener " << address_
                       << ": accept: " << ErrnoText(errno) << " ("
                       << accept_errors_ << " so far); pausing accepts 100ms";
        }
        *paused_until = absl::Now() + absl::Milliseconds(100);
        return;
      }
      Fd conn(c);
      if (static_cast<int>(pending->size()) >= max_pending_) {
        // Closed unread: a flood of idle connections costs a descriptor
        // each until its handshake deadline, and no more.
        if (refused_++ % 1000 == 0) {
          LOG(WARNING) << "listener " << address_ << ": " << max_pending_
                       << " handshakes pending; closing the connection from "
                       << SockaddrToString(from) << " (" << refused_
                       << " closed so far)";
        }
        continue;
      }
      SetConnectionOptions(conn.get());
      auto p = std::make_unique<Pending>();
      p->fd = std::move(conn);
      p->peer = SockaddrToString(from);
      p->deadline = absl::Now() + options_.handshake_timeout;
      Read(p.get());  // the hello may be there already
      pending->push_back(std::move(p));
    }
  }

  // Reads what has arrived of the current message; acts on each complete
  // one.
  void Read(Pending* p) {
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

  // Acts on a complete message: `p->in` holds `p->want` bytes.
  void Complete(Pending* p) {
    if (p->state == State::kHello && p->want == kHandshakePrefixSize) {
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
    if (p->state == State::kHello) {
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
      return;
    }
    CheckProof(p);
  }

  // A connection whose hello is in: once its (job, to_rank) has registered,
  // checks the ranks and sends the challenge.
  void Route(Pending* p) {
    std::shared_ptr<Registration> reg;
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
      } else if (p->hello.from_rank <= reg->rank ||
                 p->hello.from_rank >= world) {
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

  // The proof is in: only a dialer that holds the secret gets further.
  void CheckProof(Pending* p) {
    absl::StatusOr<std::string> mac = DecodeHandshakeProof(p->in.data());
    const std::string failed =
        absl::StrCat(p->who, ": data-plane authentication failed");
    if (!mac.ok()) {
      Reject(p, absl::StrCat(failed, ": ", mac.status().message()));
      return;
    }
    Registration& reg = *p->reg;
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

  // Writes what it can of `p->out`; once an accept is out, hands the
  // connection over.
  void Flush(Pending* p) {
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
    if (p->state != State::kAccepting) return;
    Registration& reg = *p->reg;
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

  // A deadline passed.
  void Expire(Pending* p) {
    switch (p->state) {
      case State::kHello:
        Reject(p, absl::StrCat("handshake: timed out after ", p->in.size(),
                               " of ", p->want, " bytes"));
        return;
      case State::kRegistration:
        Reject(p, absl::StrCat(
                      p->who,
                      ": no such job/rank registered with this "
                      "listener within ",
                      absl::FormatDuration(options_.unknown_job_timeout)));
        return;
      case State::kProof:
        Reject(p, absl::StrCat(
                      p->who, ": handshake: no proof of the job secret within ",
                      absl::FormatDuration(options_.handshake_timeout),
                      " (got ", p->in.size(), " of ", p->want, " bytes)"));
        return;
      case State::kAccepting:
        Close(p, absl::StrCat(p->who,
                              ": cannot answer the handshake: timed out "
                              "writing the accept"));
        return;
    }
  }

  // Logs why, sends the rejection with one non-blocking send (best effort:
  // a dialer that does not read loses it), and closes.
  void Reject(Pending* p, const std::string& reason) {
    const std::string reply =
        EncodeHandshakeReply(HandshakeReplyCode::kRejected, reason);
    const ssize_t w = ::send(p->fd.get(), reply.data(), reply.size(),
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    Close(p, reason);
  }

  // Logs why and closes the connection, dropping what it sent unread.
  void Close(Pending* p, const std::string& reason) {
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

  const Fd fd_;
  const std::string address_;
  const PeerListenerOptions options_;
  const int max_pending_;  // options_.max_pending_handshakes, fd-limited
  StopSignal wake_;        // Register and the destructor
  std::thread loop_thread_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::pair<std::string, int>, std::shared_ptr<Registration>> registry_
      ABSL_GUARDED_BY(mu_);
  // Only the loop thread.
  int64_t refused_ = 0;  // closed at the cap
  int64_t accept_errors_ = 0;
};

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
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) {
    return absl::InternalError(
        absl::StrCat("listen on ", address, ": socket: ", ErrnoText(errno)));
  }
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("listen on ", address, ": bind: ", ErrnoText(errno)));
  }
  if (::listen(fd.get(), SOMAXCONN) != 0) {
    return absl::UnavailableError(
        absl::StrCat("listen on ", address, ": listen: ", ErrnoText(errno)));
  }
  socklen_t len = sizeof(sa);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len);
  // Pending handshakes hold a descriptor each; leave half of the process's
  // limit to everything else (transports, gRPC, files).
  int max_pending = options.max_pending_handshakes;
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 &&
      nofile.rlim_cur != RLIM_INFINITY &&
      nofile.rlim_cur / 2 < static_cast<rlim_t>(max_pending)) {
    max_pending = std::max(1, static_cast<int>(nofile.rlim_cur / 2));
    LOG(INFO) << "listener " << SockaddrToString(sa) << ": at most "
              << max_pending
              << " pending handshakes (half the descriptor limit "
              << nofile.rlim_cur << "), not " << options.max_pending_handshakes;
  }
  return std::unique_ptr<PeerListener>(new PeerListenerImpl(
      std::move(fd), SockaddrToString(sa), options, max_pending));
}

namespace {

const char* ReplyName(HandshakeReplyCode code) {
  switch (code) {
    case HandshakeReplyCode::kAccepted:
      return "an accept";
    case HandshakeReplyCode::kRejected:
      return "a rejection";
    case HandshakeReplyCode::kChallenge:
      return "a challenge";
  }
  return "a reply";
}

// Reads one listener message and returns its body if it is a `want`. A
// rejection is Unavailable "handshake rejected: <the listener's reason>".
absl::StatusOr<std::string> ReadHandshakeReply(int fd, HandshakeReplyCode want,
                                               absl::Time deadline,
                                               int stop_fd) {
  char prefix[kHandshakeReplyPrefixSize];
  size_t got = 0;
  RETURN_IF_ERROR(
      ReadFull(fd, prefix, sizeof(prefix), deadline, stop_fd, &got));
  HandshakeReplyCode code;
  uint16_t body_len = 0;
  RETURN_IF_ERROR(DecodeHandshakeReplyPrefix(prefix, &code, &body_len));
  std::string body(body_len, '\0');
  RETURN_IF_ERROR(
      ReadFull(fd, body.data(), body.size(), deadline, stop_fd, &got));
  if (code == HandshakeReplyCode::kRejected) {
    // From a peer not yet authenticated: control bytes are escaped before
    // the text reaches logs and job reasons.
    std::string shown;
    for (unsigned char c : body) {
      if (c < 0x20 || c == 0x7f) {
        absl::StrAppend(&shown, "\\x", absl::Hex(c, absl::kZeroPad2));
      } else {
        shown.push_back(static_cast<char>(c));
      }
    }
    return absl::UnavailableError(absl::StrCat("handshake rejected: ", shown));
  }
  if (code != want) {
    return absl::DataLossError(
        absl::StrCat("expected ", ReplyName(want), ", got ", ReplyName(code)));
  }
  return body;
}

// The dialer's side of the handshake on a connected socket: hello (with a
// fresh nonce), the listener's challenge, our proof, then the accept and the
// listener's proof, checked before anything else is read. Errors say which
// step failed; a rejection carries the listener's reason.
absl::Status DialHandshake(int fd, Handshake hello, const std::string& secret,
                           absl::Time deadline, int stop_fd) {
  hello.nonce = NewHandshakeNonce();
  auto step = [](const char* what, const absl::Status& s) {
    if (s.ok() || absl::IsCancelled(s) ||
        absl::StartsWith(s.message(), "handshake rejected: ")) {
      return s;
    }
    return absl::Status(s.code(),
                        absl::StrCat("handshake: ", what, ": ", s.message()));
  };
  RETURN_IF_ERROR(
      step("sending the hello",
           WriteString(fd, EncodeHandshake(hello), deadline, stop_fd)));
  absl::StatusOr<std::string> listener_nonce =
      ReadHandshakeReply(fd, HandshakeReplyCode::kChallenge, deadline, stop_fd);
  RETURN_IF_ERROR(step("reading the challenge", listener_nonce.status()));
  const std::string proof = EncodeHandshakeProof(
      HandshakeMac(secret, HandshakeRole::kDialer, hello, *listener_nonce));
  RETURN_IF_ERROR(
      step("sending the proof", WriteString(fd, proof, deadline, stop_fd)));
  absl::StatusOr<std::string> listener_mac =
      ReadHandshakeReply(fd, HandshakeReplyCode::kAccepted, deadline, stop_fd);
  RETURN_IF_ERROR(step("reading the accept", listener_mac.status()));
  if (!HandshakeMacMatches(HandshakeMac(secret, HandshakeRole::kListener, hello,
                                        *listener_nonce),
                           *listener_mac)) {
    return absl::UnauthenticatedError(
        "handshake: data-plane authentication of the listener failed: its "
        "proof does not match this job's secret (a different secret, or "
        "another process at that address)");
  }
  return absl::OkStatus();
}

// Dials `address`, retrying refused connections and failed handshakes, and
// performs the handshake. Errors say why the last attempt failed; Cancelled
// as soon as `stop_fd` fires.
absl::StatusOr<Fd> Dial(const std::string& address, const Handshake& hello,
                        const std::string& secret, absl::Time deadline,
                        int stop_fd) {
  ASSIGN_OR_RETURN(sockaddr_in sa, ResolveIpv4(address));
  absl::Status last = absl::DeadlineExceededError("no attempt made");
  const absl::Status cancelled =
      absl::CancelledError("connection setup cancelled");
  while (absl::Now() < deadline) {
    if (Stopped(stop_fd)) return cancelled;
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) {
      return absl::InternalError(absl::StrCat("socket: ", ErrnoText(errno)));
    }
    SetConnectionOptions(fd.get());
    int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    if (rc != 0 && errno == EINPROGRESS) {
      absl::Status s = WaitFd(fd.get(), POLLOUT, deadline, stop_fd);
      if (absl::IsCancelled(s)) return cancelled;
      if (!s.ok()) {
        last = absl::DeadlineExceededError("connect timed out");
        break;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      last =
          absl::UnavailableError(absl::StrCat("connect: ", ErrnoText(errno)));
      if (SleepUnlessStopped(absl::Milliseconds(20), stop_fd)) return cancelled;
      continue;
    }
    const absl::Status s =
        DialHandshake(fd.get(), hello, secret, deadline, stop_fd);
    if (absl::IsCancelled(s)) return cancelled;
    if (s.ok()) return fd;
    last = s;
    if (SleepUnlessStopped(absl::Milliseconds(50), stop_fd)) return cancelled;
  }
  return last;
}

class TcpTransport : public Transport {
 public:
  TcpTransport(const TcpTransportOptions& options, std::vector<Fd> fds)
      : options_(options), peers_(options.peer_addresses.size()) {
    for (size_t r = 0; r < peers_.size(); ++r) {
      if (static_cast<int>(r) == options_.rank) continue;
      auto p = std::make_unique<Peer>();
      p->rank = static_cast<int>(r);
      p->name = absl::StrCat("rank ", r, " (", options_.peer_addresses[r], ")");
      p->fd = std::move(fds[r]);
      peers_[r] = std::move(p);
    }
    for (auto& p : peers_) {
      if (p == nullptr) continue;
      Peer* peer = p.get();
      peer->sender = std::thread([this, peer] { SendLoop(peer); });
      peer->receiver = std::thread([this, peer] { ReceiveLoop(peer); });
    }
  }

  ~TcpTransport() override {
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

  int rank() const override { return options_.rank; }
  int world_size() const override { return static_cast<int>(peers_.size()); }

  absl::Status Send(int peer, Message message) override {
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

  absl::StatusOr<Message> Recv(int peer, absl::Duration timeout) override {
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

  absl::Status AllReduceSum(std::vector<double>* values,
                            absl::Duration timeout) override;

  int64_t payload_bytes_sent() const override { return bytes_sent_.load(); }
  int64_t payload_bytes_received() const override {
    return bytes_received_.load();
  }

  void Abort(const absl::Status& reason) override {
    std::vector<Peer*> tell;
    {
      absl::MutexLock lock(&mu_);
      if (fatal_.ok()) {
        fatal_ = absl::AbortedError(reason.ok() ? "aborted" : reason.message());
      }
      // The first Abort tells the peers and closes the sockets; a later one
      // (e.g. the stage failing because of the first) must not cut its
      // frames short.
      if (abort_started_) return;
      abort_started_ = true;
      // With fatal_ set no sender starts another frame; give the ones in
      // the middle of a frame a moment to finish so that the abort frame
      // starts on a frame boundary. A stuck one is not waited for.
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
        tell.push_back(p.get());
      }
    }
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
        LOG(WARNING) << "job \"" << options_.job_id << "\" rank "
                     << options_.rank << ": cannot tell " << p->name
                     << " about the abort: " << s.message();
      }
    }
    stop_.Signal();
    for (auto& p : peers_) {
      if (p != nullptr) ::shutdown(p->fd.get(), SHUT_RDWR);
    }
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

  absl::Status CheckPeer(int peer, const char* what) const {
    if (peer < 0 || peer >= world_size() || peer == options_.rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", options_.rank, ": cannot ", what, " rank ",
                       peer, " of ", world_size()));
    }
    return absl::OkStatus();
  }

  absl::Status Enqueue(int peer, Outgoing out,
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

  // Pops the next frame from `peer` (user or all-reduce queue).
  absl::StatusOr<Frame> Take(int peer, bool reduce, absl::Time deadline,
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

  // Records the first connection error and stops every thread; pending and
  // later calls return it.
  void Fail(Peer* p, const absl::Status& s) {
    SetFatal(absl::Status(s.code(), absl::StrCat(p->name, ": ", s.message())));
  }

  void SetFatal(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (!fatal_.ok()) return;
    fatal_ = s;
    LOG(WARNING) << "job \"" << options_.job_id << "\" rank " << options_.rank
                 << ": " << fatal_.message();
    stop_.Signal();
  }

  void SendLoop(Peer* p) {
    while (true) {
      Outgoing out;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !p->outbox.empty() || !fatal_.ok();
        };
        mu_.Await(absl::Condition(&ready));
        if (!fatal_.ok()) return;
        out = std::move(p->outbox.front());
        p->outbox.pop_front();
        p->writing = true;
      }
      if (out.kind == FrameKind::kGoodbye) {
        absl::StatusOr<std::string> h = EncodeFrameHeader(
            FrameKind::kGoodbye, options_.job_id, 0, 0, 0, {});
        out.header = *h;
      }
      const absl::Status s =
          WriteFrame(p->fd.get(), out.header, out.tensors,
                     absl::Now() + options_.io_timeout, stop_.fd());
      {
        absl::MutexLock lock(&mu_);
        p->writing = false;
        // A frame cut short leaves the stream unusable for an abort frame.
        if (!s.ok() || out.kind == FrameKind::kGoodbye) p->write_closed = true;
      }
      if (!s.ok()) {
        if (!absl::IsCancelled(s)) {
          // A peer that aborted sent its reason just before closing; the
          // receive loop may still be reading it. Give it a moment to be the
          // first error (the cause) rather than this broken pipe (a symptom).
          {
            absl::MutexLock lock(&mu_);
            auto failed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
              return !fatal_.ok();
            };
            mu_.AwaitWithTimeout(absl::Condition(&failed),
                                 absl::Milliseconds(200));
          }
          Fail(p,
               absl::Status(s.code(),
                            absl::StrCat("sending a ", FrameKindName(out.kind),
                                         " frame: ", s.message())));
        }
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

  void ReceiveLoop(Peer* p) {
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
      if (f->header.job_id != options_.job_id) {
        Fail(p,
             absl::DataLossError(absl::StrCat(
                 "received a frame for job \"", f->header.job_id,
                 "\"; this transport serves job \"", options_.job_id, "\"")));
        return;
      }
      if (absl::Status s = CheckFrameContent(*f, options_.rank, p->rank);
          !s.ok()) {
        Fail(p, s);
        return;
      }
      if (f->header.prefix.kind == FrameKind::kAbort) {
        absl::StatusOr<AbortReason> why =
            DecodeAbortFrame(f->header, f->tensors);
        if (!why.ok()) {
          Fail(p, why.status());
        } else {
          SetFatal(absl::Status(
              why->code, absl::StrCat(p->name, " aborted: ", why->message)));
        }
        return;
      }
      absl::MutexLock lock(&mu_);
      switch (f->header.prefix.kind) {
        case FrameKind::kGoodbye:
          p->said_goodbye = true;
          return;
        case FrameKind::kAllReduceContribution:
        case FrameKind::kAllReduceResult:
        case FrameKind::kAllReduceError:
          p->reduce_inbox.push_back(*std::move(f));
          break;
        default:
          p->inbox.push_back(*std::move(f));
      }
    }
  }

  absl::Status SendReduceFrame(int peer, FrameKind kind, int64_t round,
                               Tensor t) {
    std::vector<std::pair<std::string, Tensor>> ts = {
        {kind == FrameKind::kAllReduceError ? "message" : "values", t}};
    Outgoing out{kind};
    ASSIGN_OR_RETURN(out.header,
                     EncodeFrameHeader(kind, options_.job_id, round, 0, 0, ts));
    return Enqueue(peer, std::move(out), ts);
  }

  const TcpTransportOptions options_;
  StopSignal stop_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank; null for ours
  int64_t reduce_round_ = 0;                  // only the caller's thread
  absl::Mutex mu_;
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  bool abort_started_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
};

Tensor DoublesToTensor(const std::vector<double>& v) {
  Tensor t = Tensor::Empty(DType::kFloat64, {static_cast<int64_t>(v.size())});
  if (!v.empty())
    std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(double));
  return t;
}

absl::Status TcpTransport::AllReduceSum(std::vector<double>* values,
                                        absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const int64_t round = reduce_round_++;
  const int n = world_size();
  const std::string me =
      absl::StrCat("rank ", options_.rank, ": all-reduce round ", round);
  if (options_.rank != 0) {
    RETURN_IF_ERROR(SendReduceFrame(0, FrameKind::kAllReduceContribution, round,
                                    DoublesToTensor(*values)));
    ASSIGN_OR_RETURN(Frame f, Take(0, true, deadline, timeout));
    const FramePrefix& pf = f.header.prefix;
    // ReceiveLoop has checked each kind's tensors (CheckFrameContent).
    if (pf.kind == FrameKind::kAllReduceError && f.tensors.size() == 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          me, ": rank 0 failed the round: ",
          absl::string_view(static_cast<const char*>(f.tensors[0].raw_data()),
                            f.tensors[0].nbytes())));
    }
    if (pf.kind != FrameKind::kAllReduceResult || pf.step != round ||
        f.tensors.size() != 1 || f.tensors[0].dtype() != DType::kFloat64 ||
        f.tensors[0].numel() != static_cast<int64_t>(values->size())) {
      return absl::InternalError(
          absl::StrCat(me, ": unexpected ", FrameKindName(pf.kind),
                       " frame for round ", pf.step, " from rank 0"));
    }
    std::memcpy(values->data(), f.tensors[0].raw_data(), f.tensors[0].nbytes());
    return absl::OkStatus();
  }
  // Rank 0: gather in rank order, sum, broadcast.
  std::vector<Tensor> parts(n);
  std::string error;
  for (int r = 1; r < n; ++r) {
    ASSIGN_OR_RETURN(Frame f, Take(r, true, deadline, timeout));
    const FramePrefix& pf = f.header.prefix;
    if (pf.kind != FrameKind::kAllReduceContribution || pf.step != round ||
        f.tensors.size() != 1 || f.tensors[0].dtype() != DType::kFloat64) {
      error = absl::StrCat("unexpected ", FrameKindName(pf.kind),
                           " frame for round ", pf.step, " from rank ", r);
    } else if (f.tensors[0].numel() != static_cast<int64_t>(values->size())) {
      error = absl::StrCat("rank ", r, " sent ", f.tensors[0].numel(),
                           " values, rank 0 sent ", values->size());
    }
    if (!error.empty()) break;
    parts[r] = std::move(f.tensors[0]);
  }
  if (!error.empty()) {
    // The receivers reject longer ones (CheckFrameContent).
    const size_t len =
        std::min(error.size(), static_cast<size_t>(kMaxAbortMessageLength));
    Tensor msg = Tensor::Empty(DType::kUInt8, {static_cast<int64_t>(len)});
    std::memcpy(msg.raw_data(), error.data(), len);
    for (int r = 1; r < n; ++r) {
      SendReduceFrame(r, FrameKind::kAllReduceError, round, msg).IgnoreError();
    }
    return absl::InvalidArgumentError(absl::StrCat(me, ": ", error));
  }
  // Same order and starting value as the in-process transport: 0.0 + v0 +
  // v1 + ... so that both give bitwise the same sums.
  std::vector<double> sum(values->size(), 0.0);
  for (int r = 0; r < n; ++r) {
    const double* v = r == 0 ? values->data() : parts[r].data<double>();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
  }
  *values = std::move(sum);
  const Tensor result = DoublesToTensor(*values);
  for (int r = 1; r < n; ++r) {
    RETURN_IF_ERROR(
        SendReduceFrame(r, FrameKind::kAllReduceResult, round, result));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> ConnectTcpTransport(
    PeerListener* listener, const TcpTransportOptions& options) {
  const int world = static_cast<int>(options.peer_addresses.size());
  const std::string me =
      absl::StrCat("job \"", options.job_id, "\" rank ", options.rank);
  if (options.job_id.empty() ||
      options.job_id.size() > static_cast<size_t>(kMaxJobIdLength)) {
    return absl::InvalidArgumentError(
        absl::StrCat(me, ": job id must be 1..", kMaxJobIdLength, " bytes"));
  }
  if (options.rank < 0 || options.rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat(me, ": rank not in [0, ", world, ") (peer_addresses has ",
                     world, " entries)"));
  }
  if (options.keepalive_idle < absl::Seconds(1) ||
      options.keepalive_interval < absl::Seconds(1) ||
      options.keepalive_count < 1 ||
      options.keepalive_idle > absl::Seconds(32767) ||
      options.keepalive_interval > absl::Seconds(32767) ||
      options.keepalive_count > 127) {
    return absl::InvalidArgumentError(absl::StrCat(
        me,
        ": keepalive_idle and keepalive_interval must be in [1s, 32767s] "
        "and keepalive_count in [1, 127], got ",
        absl::FormatDuration(options.keepalive_idle), ", ",
        absl::FormatDuration(options.keepalive_interval), ", ",
        options.keepalive_count));
  }
  if (options.tcp_user_timeout < absl::ZeroDuration() ||
      options.tcp_user_timeout > absl::Milliseconds(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        me, ": tcp_user_timeout must be >= 0 and fit in int32 ms, got ",
        absl::FormatDuration(options.tcp_user_timeout)));
  }
  auto* impl = dynamic_cast<PeerListenerImpl*>(listener);
  if (impl == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(me, ": listener was not made by PeerListener::Listen"));
  }
  auto cancel_requested = [&options] {
    return options.cancel != nullptr && options.cancel->load();
  };
  const absl::Status cancelled =
      absl::CancelledError(absl::StrCat(me, ": connection setup cancelled"));
  if (cancel_requested()) return cancelled;
  ASSIGN_OR_RETURN(
      std::shared_ptr<Registration> reg,
      impl->Register(options.job_id, options.rank, world, options.secret));
  const absl::Time deadline = absl::Now() + options.connect_timeout;

  // Dial every lower rank in parallel; higher ranks dial us. `stop_dialing`
  // cuts the dialers short on a cancel.
  StopSignal stop_dialing;
  std::vector<absl::StatusOr<Fd>> dialed;
  for (int r = 0; r < options.rank; ++r) {
    dialed.emplace_back(absl::UnknownError("not dialed"));
  }
  int dialing = options.rank;  // guarded by reg->mu
  std::vector<std::thread> dialers;
  for (int r = 0; r < options.rank; ++r) {
    dialers.emplace_back([&, r] {
      dialed[r] = Dial(options.peer_addresses[r],
                       Handshake{options.job_id, options.rank, r},
                       options.secret, deadline, stop_dialing.fd());
      absl::MutexLock lock(&reg->mu);
      --dialing;
    });
  }
  // Wait until every dial is done and every higher rank is in, the
  // deadline passes, or the cancel flag is set (polled, since nothing
  // signals it).
  bool was_cancelled = false;
  {
    absl::MutexLock lock(&reg->mu);
    auto all_in = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reg->mu) {
      if (dialing > 0) return false;
      for (int r = options.rank + 1; r < world; ++r) {
        if (!reg->accepted[r].valid()) return false;
      }
      return true;
    };
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reg->mu) {
      return all_in() || cancel_requested();
    };
    while (!done() && absl::Now() < deadline) {
      reg->mu.AwaitWithDeadline(
          absl::Condition(&done),
          std::min(deadline, absl::Now() + kCancelPollInterval));
    }
    was_cancelled = !all_in() && cancel_requested();
  }
  if (was_cancelled) stop_dialing.Signal();
  for (auto& t : dialers) t.join();
  impl->Unregister(reg);
  if (was_cancelled) {
    LOG(INFO) << me << ": connection setup cancelled";
    return cancelled;
  }

  std::vector<Fd> fds(world);
  std::vector<std::string> missing;
  for (int r = 0; r < options.rank; ++r) {
    if (dialed[r].ok()) {
      fds[r] = *std::move(dialed[r]);
    } else {
      missing.push_back(absl::StrCat("rank ", r, " (",
                                     options.peer_addresses[r],
                                     "): ", dialed[r].status().message()));
    }
  }
  {
    absl::MutexLock lock(&reg->mu);
    for (int r = options.rank + 1; r < world; ++r) {
      if (reg->accepted[r].valid()) {
        fds[r] = std::move(reg->accepted[r]);
      } else {
        missing.push_back(absl::StrCat(
            "rank ", r, " (", options.peer_addresses[r], "): never connected"));
      }
    }
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat(me, ": peers not connected within ",
                     absl::FormatDuration(options.connect_timeout), ": ",
                     absl::StrJoin(missing, "; ")));
  }
  for (int r = 0; r < world; ++r) {
    if (r == options.rank) continue;
    const absl::Status s = SetLivenessOptions(fds[r].get(), options);
    if (!s.ok()) {
      return absl::InternalError(absl::StrCat(me, ": connection to rank ", r,
                                              " (", options.peer_addresses[r],
                                              "): ", s.message()));
    }
  }
  return std::unique_ptr<Transport>(new TcpTransport(options, std::move(fds)));
}

}  // namespace trainyard
