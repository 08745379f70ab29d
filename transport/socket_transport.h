// The TCP transport once connected: a Transport over one connected socket
// per peer, made by ConnectTcpTransport (transport/tcp_transport.h, whose
// comment gives the guarantees). Each peer has a sender thread that writes
// queued frames (transport/frame_stream.h) and a receiver thread that reads
// and checks them; AllReduceSum is transport/collectives.h's, its messages
// carried in frames of kinds 16-18 through rank 0.
//
// Thread safety: as transport/transport.h.
#ifndef TRAINYARD_TRANSPORT_SOCKET_TRANSPORT_H_
#define TRAINYARD_TRANSPORT_SOCKET_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "net/socket_io.h"
#include "transport/transport.h"

namespace trainyard {

struct SocketTransportOptions {
  std::string job_id;
  int rank = 0;
  // host:port of every rank, indexed by rank: names peers in errors.
  std::vector<std::string> peer_addresses;
  // Longest a frame may take to write, and to read once its first byte is
  // in.
  absl::Duration io_timeout = absl::Seconds(60);
};

// Takes over `sockets` (indexed by rank; entry `options.rank` unused), each
// connected to that rank and past its handshake, and starts their threads.
std::unique_ptr<Transport> NewSocketTransport(
    const SocketTransportOptions& options, std::vector<Fd> sockets);

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_SOCKET_TRANSPORT_H_
