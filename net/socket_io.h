// Socket I/O with deadlines: an owned descriptor, an eventfd that wakes
// poll(), and full reads and writes on non-blocking sockets that wait with
// poll() until a deadline passes or a stop descriptor fires. Used by the
// TCP transport (transport/) and the servers of net/poll_server.h.
//
// Conventions: `deadline` is absolute (absl::InfiniteFuture() waits for
// ever, polling once a second); `stop_fd` is a PollSignal's fd(), or -1
// for none. A wait that passes its deadline is DeadlineExceeded, one cut
// short by `stop_fd` is Cancelled.
//
// Thread safety: Fd and the functions are as safe as the descriptors they
// are given; PollSignal::Signal may be called from any thread.
#ifndef TRAINYARD_NET_SOCKET_IO_H_
#define TRAINYARD_NET_SOCKET_IO_H_

#include <netinet/in.h>
#include <sys/uio.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace trainyard {

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
  void Reset();

 private:
  int fd_ = -1;
};

// strerror(err).
std::string ErrnoText(int err);

// An eventfd that, once signalled, stays readable until Clear(): every
// poll() that includes it wakes up. As a stop, it is signalled once and
// never cleared; as a wakeup, the polling thread clears it.
class PollSignal {
 public:
  PollSignal();  // CHECK-fails when no eventfd can be made
  void Signal();
  // Makes it unreadable again.
  void Clear();
  int fd() const { return fd_.get(); }

 private:
  Fd fd_;
};

// "10.0.0.5:7000".
std::string SockaddrToString(const sockaddr_in& address);

// TCP_NODELAY and O_NONBLOCK on a connection.
void SetNoDelayAndNonBlocking(int fd);

// Milliseconds for poll() until `deadline`: at most 1000 (a wait with no
// deadline still comes back once a second), rounded up, 0 once it passed.
int PollTimeoutMs(absl::Time deadline);

// Waits until `fd` has `events` (POLLIN or POLLOUT), a hang-up or an
// error. DeadlineExceeded ("timed out") after `deadline`; Cancelled when
// `stop_fd` fires first; Internal when poll fails.
absl::Status WaitFd(int fd, short events, absl::Time deadline, int stop_fd);

// True once `stop_fd` (-1: never) has fired.
bool IsSignalled(int stop_fd);

// Sleeps for `d` unless `stop_fd` fires first; true if it did.
bool SleepUnlessSignalled(absl::Duration d, int stop_fd);

// Reads exactly `n` bytes into `buf`; *got counts the bytes read, across
// calls. EOF is Unavailable "connection closed"; a socket error is
// Unavailable with its text.
absl::Status ReadFull(int fd, char* buf, size_t n, absl::Time deadline,
                      int stop_fd, size_t* got);

// Writes every byte of `iov` (modified in place), without SIGPIPE. A
// socket error is Unavailable with its text.
absl::Status WriteAll(int fd, std::vector<iovec>* iov, absl::Time deadline,
                      int stop_fd);

// WriteAll of one string.
absl::Status WriteString(int fd, const std::string& s, absl::Time deadline,
                         int stop_fd);

}  // namespace trainyard

#endif  // TRAINYARD_NET_SOCKET_IO_H_
