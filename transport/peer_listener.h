// The TCP transport's listener: accepts peer connections on one port and
// runs the listener's side of the connection handshake
// (docs/TRANSPORT_FRAME.md, "Connection setup"), then hands each connection
// to the ConnectTcpTransport call registered for its job and rank
// (transport/tcp_transport.h).
//
// Thread safety: thread-safe.
#ifndef TRAINYARD_TRANSPORT_PEER_LISTENER_H_
#define TRAINYARD_TRANSPORT_PEER_LISTENER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "net/socket_io.h"

namespace trainyard {

struct PeerListenerOptions {
  // Longest an accepted connection may take to send its hello, and again
  // its proof once challenged.
  absl::Duration handshake_timeout = absl::Seconds(5);
  // How long a handshake for a job/rank that has not registered yet waits
  // for it (the dialer may be faster than the local stage); after that the
  // connection is closed and the reason logged and sent back.
  absl::Duration unknown_job_timeout = absl::Seconds(10);
  // At most this many connections in their handshake at once (each holds a
  // descriptor, no thread, until its handshake ends); one more is closed at
  // once, unread. Listen lowers it to half the process's descriptor limit
  // (RLIMIT_NOFILE). Dialers of a real job retry until their connect
  // timeout; an idle connection holds its place for at most
  // handshake_timeout (unknown_job_timeout once its hello names a job), so
  // a flood that stops delays them by at most that.
  int max_pending_handshakes = 1024;
};

// Accepts peer connections on one port and hands each, after its handshake,
// to the ConnectTcpTransport call setting up that job and rank. Connections
// that fail the handshake (a bad hello, an unknown job, a wrong proof of the
// job secret, a timeout) are answered with the reason, logged and closed; the
// listener keeps serving, and the registration of the job they named stays
// open for the real peer. All pending handshakes share one thread: a slow or
// silent connection does not hold up another's. It must outlive every
// ConnectTcpTransport call that uses it (not the transports it returned).
class PeerListener {
 public:
  // Listens on `address` ("127.0.0.1:0" picks a free port; "0.0.0.0:7000"
  // for pods). Errors name the address.
  static absl::StatusOr<std::unique_ptr<PeerListener>> Listen(
      const std::string& address);
  static absl::StatusOr<std::unique_ptr<PeerListener>> Listen(
      const std::string& address, const PeerListenerOptions& options);
  virtual ~PeerListener() = default;
  // The bound address, host:port, with the real port.
  virtual std::string address() const = 0;
};

// A registration with a listener: the connections accepted so far for one
// job rank, by the dialing rank, and the job secret their dialers must
// prove. Shared by the listener's thread and the ConnectTcpTransport call
// that registered it.
struct PeerRegistration {
  PeerRegistration(std::string job_id, int rank, int world_size,
                   std::string secret)
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
  // Unregistered: connections that finish their handshake now are closed.
  bool closed ABSL_GUARDED_BY(mu) = false;
};

// The side of a listener that ConnectTcpTransport uses. Every listener
// PeerListener::Listen returns is one.
class RegisteringPeerListener : public PeerListener {
 public:
  // Registers (job_id, rank): connections that name it are challenged with
  // `secret` and, once proved, land in the registration. AlreadyExists
  // naming the listener when that job rank is registered already.
  virtual absl::StatusOr<std::shared_ptr<PeerRegistration>> Register(
      const std::string& job_id, int rank, int world_size,
      const std::string& secret) = 0;
  // Closes `registration`: no connection lands in it any more.
  virtual void Unregister(
      const std::shared_ptr<PeerRegistration>& registration) = 0;
};

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_PEER_LISTENER_H_
