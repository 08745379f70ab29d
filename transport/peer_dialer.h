// The TCP transport's dialer: connects to a peer's listener
// (transport/peer_listener.h) and runs the dialer's side of the connection
// handshake (docs/TRANSPORT_FRAME.md, "Connection setup"): the hello with a
// fresh nonce, the listener's challenge, our proof of the job secret, then
// the accept carrying the listener's proof, checked before anything else is
// read.
//
// Thread safety: thread-compatible; separate calls may run in parallel.
#ifndef TRAINYARD_TRANSPORT_PEER_DIALER_H_
#define TRAINYARD_TRANSPORT_PEER_DIALER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "net/socket_io.h"
#include "transport/frame.h"

namespace trainyard {

// Dials `address` and performs the handshake for `hello` (its nonce is
// made here) with `secret`, retrying refused connections (every 20 ms) and
// failed handshakes (every 50 ms) until `deadline`. Returns the connected,
// non-blocking socket. Errors say why the last attempt failed, or, when
// the deadline cut the last attempt short, why the one before it did (a
// rejection carries the listener's reason: Unavailable "handshake
// rejected: ..."; a listener without the secret is Unauthenticated);
// Cancelled
// "connection setup cancelled" as soon as `stop_fd` fires
// (net/socket_io.h).
absl::StatusOr<Fd> DialPeer(const std::string& address, const Handshake& hello,
                            const std::string& secret, absl::Time deadline,
                            int stop_fd);

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_PEER_DIALER_H_
