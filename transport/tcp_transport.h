// TCP Transport: pipeline stages in different processes (or machines)
// exchanging framed tensor messages over TCP. The frame format is
// docs/TRANSPORT_FRAME.md.
//
// A worker owns one PeerListener (transport/peer_listener.h) for its
// lifetime (bound before it registers, so it can report its address). Each
// job stage calls ConnectTcpTransport with the addresses of every stage
// (from the controller's rendezvous); it dials the peers it needs
// (transport/peer_dialer.h) and accepts the connections the others dial,
// through the listener, matched by job id and rank in a handshake in which
// both ends prove they hold the job's secret (TcpTransportOptions::secret)
// before any frame is exchanged. The transport it returns is
// transport/socket_transport.h's.
//
// Guarantees (on top of transport.h): every read and write has a timeout;
// a partial read, a peer that disconnects, a frame with a bad magic,
// version, size or checksum, or one for another job is an error naming the
// peer rank and address and the reason — never a crash or a hang. Send is
// buffered: it queues the frame for a per-peer sender thread and returns, so
// a 1F1B schedule never blocks on a send.
//
// Thread safety: as transport.h; PeerListener is thread-safe.
#ifndef TRAINYARD_TRANSPORT_TCP_TRANSPORT_H_
#define TRAINYARD_TRANSPORT_TCP_TRANSPORT_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/peer_listener.h"
#include "transport/transport.h"

namespace trainyard {

struct TcpTransportOptions {
  std::string job_id;
  int rank = 0;
  // The job's data-plane secret (bytes; the controller gives every stage of
  // a job attempt the same random 32 bytes). Each connection's ends prove to
  // each other that they hold it (HMAC-SHA256 challenge-response,
  // docs/TRANSPORT_FRAME.md) before any frame: a dialer that cannot is
  // rejected ("... data-plane authentication failed (wrong or missing job
  // secret)") and a listener that cannot fails that dial attempt. Only the
  // connection setup is authenticated: frames are neither encrypted nor
  // signed. Empty is allowed
  // (tests, --insecure clusters): the same protocol runs with an empty key,
  // which anyone can compute.
  std::string secret;
  // host:port of every rank, indexed by rank; entry `rank` is ours.
  std::vector<std::string> peer_addresses;
  // Longest wait to establish all connections.
  absl::Duration connect_timeout = absl::Seconds(30);
  // Optional (may be null; not owned; must outlive the ConnectTcpTransport
  // call): when it becomes true while the connections are being set up,
  // ConnectTcpTransport gives up within about 50 ms and returns Cancelled
  // ("connection setup cancelled"), e.g. when the job is cancelled while a
  // stage still waits for its peers. Ignored once the transport exists (use
  // Transport::Abort then).
  const std::atomic<bool>* cancel = nullptr;
  // Longest a single frame write may take before the peer counts as gone.
  absl::Duration io_timeout = absl::Seconds(60);
  // TCP keepalive on every connection (SO_KEEPALIVE, TCP_KEEPIDLE,
  // TCP_KEEPINTVL, TCP_KEEPCNT), so that a peer machine that vanishes
  // without closing its connection is noticed while the link is idle: after
  // `keepalive_idle` of silence the kernel probes every
  // `keepalive_interval` and drops the connection after `keepalive_count`
  // unanswered probes (5 + 4 * 2 = 13 s by default); the receiving side then
  // fails with an error naming the peer. Whole seconds, each >= 1 s.
  absl::Duration keepalive_idle = absl::Seconds(5);
  absl::Duration keepalive_interval = absl::Seconds(2);
  int keepalive_count = 4;
  // TCP_USER_TIMEOUT: longest sent data may stay unacknowledged before the
  // kernel drops the connection, so a write to a dead peer fails even while
  // the socket buffer still has room (keepalive does not probe while data is
  // in flight). On Linux it also takes over from keepalive_count in deciding
  // when keepalive gives up, so the default equals idle + interval * count.
  // Zero leaves the system default (no limit).
  absl::Duration tcp_user_timeout = absl::Seconds(13);
};

// Connects rank `options.rank` to the others (the ones it needs: its
// neighbours, plus every rank for the all-reduce) and returns when all
// connections are up, DeadlineExceeded naming the ranks that did not
// connect in time, or Cancelled when `options.cancel` was set first.
//
// Topology: a full mesh, one connection per pair of ranks, dialed by the
// higher rank. AllReduceSum is transport/collectives.h's: every rank's
// vector goes to rank 0, which sums in rank order and sends the result
// back.
//
// Destroying a healthy transport flushes queued sends and tells each peer
// (a "goodbye" frame), whose later Recv from this rank then fails with
// FailedPrecondition instead of waiting; a failed or aborted one just
// closes, and its peers fail with an error naming it. A connection error
// (EOF without goodbye, a bad frame — including one whose tensors are not
// those its kind carries (docs/TRANSPORT_FRAME.md) —, write timeout) fails
// every pending and later call on this transport with a status naming the peer
// rank, address and reason.
//
// Abort(status) fails this rank's calls with Aborted carrying the status's
// message and tells every connected peer why, in an "abort" frame, before it
// closes the sockets: the peer's pending and later calls then fail with a
// status of the same code as `status`, e.g. Cancelled "rank 0
// (10.0.0.7:7000) aborted: cancelled by request: ...". Abort is bounded: a
// frame already being written gets up to 200 ms to finish (queued ones are
// dropped), then the abort frame is written straight on each socket with up
// to 200 ms per peer; a peer whose connection is stuck or broken is skipped
// and sees the connection close instead.
absl::StatusOr<std::unique_ptr<Transport>> ConnectTcpTransport(
    PeerListener* listener, const TcpTransportOptions& options);

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_TCP_TRANSPORT_H_
