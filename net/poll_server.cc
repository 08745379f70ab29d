#include "net/poll_server.h"

#include <sys/socket.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace trainyard {

absl::StatusOr<Fd> ListenTcp(sockaddr_in* address, int backlog,
                             SocketCallError* failure) {
  auto failed = [failure](absl::StatusCode code, const char* call) {
    const int err = errno;
    if (failure != nullptr) *failure = {call, err};
    return absl::Status(code, absl::StrCat(call, ": ", ErrnoText(err)));
  };
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return failed(absl::StatusCode::kInternal, "socket");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(address),
             sizeof(*address)) != 0) {
    return failed(absl::StatusCode::kUnavailable, "bind");
  }
  if (::listen(fd.get(), backlog) != 0) {
    return failed(absl::StatusCode::kUnavailable, "listen");
  }
  socklen_t len = sizeof(*address);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(address), &len);
  return fd;
}

PollServer::PollServer(Fd listener, std::string name, Handler* handler)
    : listener_(std::move(listener)),
      name_(std::move(name)),
      handler_(handler) {
  thread_ = std::thread([this] { Loop(); });
}

PollServer::~PollServer() {
  stopping_.store(true);
  wake_.Signal();
  thread_.join();
}

void PollServer::Loop() {
  std::vector<pollfd> fds;
  absl::Time accept_paused_until = absl::InfinitePast();
  while (true) {
    const absl::Time now = absl::Now();
    const bool accepting = now >= accept_paused_until;
    absl::Time wake_by =
        accepting ? absl::InfiniteFuture() : accept_paused_until;
    fds.clear();
    fds.push_back({wake_.fd(), POLLIN, 0});
    fds.push_back({accepting ? listener_.get() : -1, POLLIN, 0});  // -1: skip
    handler_->PreparePoll(now, &fds, &wake_by);
    if (::poll(fds.data(), fds.size(), PollTimeoutMs(wake_by)) < 0) {
      if (errno != EINTR) {
        LOG(ERROR) << name_ << ": poll: " << ErrnoText(errno);
        absl::SleepFor(absl::Milliseconds(10));
      }
      continue;
    }
    if (fds[0].revents & POLLIN) {
      wake_.Clear();
      // Connections the handler holds close unanswered.
      if (stopping_.load()) return;
      handler_->OnWake();
    }
    handler_->OnPolled(absl::MakeConstSpan(fds).subspan(2));
    if (fds[1].revents & POLLIN) AcceptBatch(&accept_paused_until);
  }
}

void PollServer::AcceptBatch(absl::Time* paused_until) {
  for (int i = 0; i < kMaxAcceptsPerRound; ++i) {
    sockaddr_in from{};
    socklen_t len = sizeof(from);
    const int c = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&from),
                            &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      // Out of descriptors (EMFILE) or memory: the connection stays in the
      // backlog, and the socket stays readable; pause rather than spin.
      if (accept_errors_++ % 100 == 0) {
        LOG(WARNING) << name_ << ": accept: " << ErrnoText(err) << " ("
                     << accept_errors_ << " so far); pausing accepts 100ms";
      }
      *paused_until = absl::Now() + absl::Milliseconds(100);
      return;
    }
    handler_->OnAccept(Fd(c), from);
  }
}

}  // namespace trainyard
