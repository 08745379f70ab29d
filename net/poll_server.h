// A listening TCP socket served by one thread with poll(): the one accept
// loop of Trainyard's plain-socket servers (the TCP transport's peer
// listener, transport/peer_listener.h, and the Prometheus endpoint,
// observability/prometheus_endpoint.h).
//
// Each round the thread polls a wakeup eventfd, the listening socket and
// whatever descriptors its Handler has in progress, until the handler's
// earliest deadline; then it tells the handler about a wakeup, about its
// descriptors' events, and hands it the connections waiting in the
// backlog (at most kMaxAcceptsPerRound per round, so that a flood of
// connects cannot starve the connections in progress). When accept fails
// for want of descriptors or memory, accepting pauses for 100 ms rather
// than spinning. The handler decides what blocks: the peer listener keeps
// every connection as a non-blocking state machine, the Prometheus
// endpoint answers each connection before taking the next.
//
// Thread safety: the handler's methods run on the server's thread only;
// Wake may be called from any thread.
#ifndef TRAINYARD_NET_POLL_SERVER_H_
#define TRAINYARD_NET_POLL_SERVER_H_

#include <netinet/in.h>
#include <poll.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "net/socket_io.h"

namespace trainyard {

// Which call failed and its errno, for callers that word the error
// themselves.
struct SocketCallError {
  const char* call = "";  // "socket", "bind" or "listen"
  int error_number = 0;
};

// A non-blocking, close-on-exec TCP socket with SO_REUSEADDR, bound to
// *address and listening with `backlog`; *address becomes the bound
// address (with the real port). Errors name the failing call and its errno
// ("bind: Address already in use"): Internal when no socket could be made,
// Unavailable when it cannot bind or listen; `failure` (may be null) gets
// the same as fields.
absl::StatusOr<Fd> ListenTcp(sockaddr_in* address, int backlog,
                             SocketCallError* failure);

class PollServer {
 public:
  // New connections taken per round.
  static constexpr int kMaxAcceptsPerRound = 64;

  class Handler {
   public:
    virtual ~Handler() = default;
    // A connection from `peer`, taken from the backlog (non-blocking,
    // close-on-exec). Closed when the handler drops it.
    virtual void OnAccept(Fd connection, const sockaddr_in& peer) = 0;
    // Before each poll, at `now`: appends the handler's descriptors to
    // *fds (events 0 still reports hang-ups and errors) and lowers *wake_by
    // to its earliest deadline.
    virtual void PreparePoll(absl::Time now, std::vector<pollfd>* fds,
                             absl::Time* wake_by) {}
    // After each poll: the descriptors PreparePoll appended, in its order,
    // with their revents.
    virtual void OnPolled(absl::Span<const pollfd> fds) {}
    // Wake() was called since the last poll.
    virtual void OnWake() {}
  };

  // Serves `listener` (listening, non-blocking) for `handler` on a new
  // thread. `name` starts the server's log lines ("listener 0.0.0.0:7000").
  // `handler` must outlive the server.
  PollServer(Fd listener, std::string name, Handler* handler);
  // Stops the thread once the handler's current call returns, and joins
  // it; connections the handler holds are its own to close.
  ~PollServer();
  PollServer(const PollServer&) = delete;
  PollServer& operator=(const PollServer&) = delete;

  // Makes the thread call Handler::OnWake soon.
  void Wake() { wake_.Signal(); }

 private:
  void Loop();
  // Takes up to kMaxAcceptsPerRound connections from the backlog.
  void AcceptBatch(absl::Time* paused_until);

  const Fd listener_;
  const std::string name_;
  Handler* const handler_;
  PollSignal wake_;
  std::atomic<bool> stopping_{false};
  int64_t accept_errors_ = 0;  // only the thread
  std::thread thread_;
};

}  // namespace trainyard

#endif  // TRAINYARD_NET_POLL_SERVER_H_
