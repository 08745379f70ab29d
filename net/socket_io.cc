#include "net/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace trainyard {

void Fd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string ErrnoText(int err) { return std::strerror(err); }

PollSignal::PollSignal() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  CHECK(fd_.valid()) << "eventfd: " << ErrnoText(errno);
}

void PollSignal::Signal() {
  uint64_t one = 1;
  ssize_t n = ::write(fd_.get(), &one, sizeof(one));
  (void)n;  // fails only when the counter would overflow: already set
}

void PollSignal::Clear() {
  uint64_t count;
  ssize_t n = ::read(fd_.get(), &count, sizeof(count));
  (void)n;  // EAGAIN: not signalled
}

std::string SockaddrToString(const sockaddr_in& address) {
  char host[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &address.sin_addr, host, sizeof(host));
  return absl::StrCat(host, ":", ntohs(address.sin_port));
}

void SetNoDelayAndNonBlocking(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return 1000;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  // Round up so that we do not spin on sub-millisecond remainders.
  return static_cast<int>(
      std::min<int64_t>(1000, absl::ToInt64Milliseconds(left) + 1));
}

absl::Status WaitFd(int fd, short events, absl::Time deadline, int stop_fd) {
  while (true) {
    pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int n = ::poll(fds, stop_fd >= 0 ? 2 : 1, PollTimeoutMs(deadline));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("poll: ", ErrnoText(errno)));
    }
    if (stop_fd >= 0 && (fds[1].revents & POLLIN)) {
      return absl::CancelledError("shutting down");
    }
    if (fds[0].revents != 0) return absl::OkStatus();  // ready, HUP or error
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("timed out");
    }
  }
}

bool IsSignalled(int stop_fd) {
  if (stop_fd < 0) return false;
  pollfd p = {stop_fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

bool SleepUnlessSignalled(absl::Duration d, int stop_fd) {
  if (stop_fd < 0) {
    absl::SleepFor(d);
    return false;
  }
  const absl::Time deadline = absl::Now() + d;
  const absl::Status s = WaitFd(stop_fd, POLLIN, deadline, -1);
  if (s.ok()) return true;
  if (absl::IsDeadlineExceeded(s)) return false;
  // poll failed: fall back to a plain sleep for what is left.
  absl::SleepFor(std::max(absl::ZeroDuration(), deadline - absl::Now()));
  return IsSignalled(stop_fd);
}

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

namespace {

// Drops the first `written` bytes of iov[*first...], advancing *first past
// the entries (and any empty ones after them) that are done.
void Consume(size_t written, std::vector<iovec>* iov, size_t* first) {
  while (written > 0) {
    iovec& v = (*iov)[*first];
    if (written >= v.iov_len) {
      written -= v.iov_len;
      ++*first;
    } else {
      v.iov_base = static_cast<char*>(v.iov_base) + written;
      v.iov_len -= written;
      written = 0;
    }
  }
  while (*first < iov->size() && (*iov)[*first].iov_len == 0) ++*first;
}

}  // namespace

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
    Consume(static_cast<size_t>(w), iov, &first);
  }
  return absl::OkStatus();
}

absl::Status WriteString(int fd, const std::string& s, absl::Time deadline,
                         int stop_fd) {
  std::vector<iovec> iov = {{const_cast<char*>(s.data()), s.size()}};
  return WriteAll(fd, &iov, deadline, stop_fd);
}

}  // namespace trainyard
