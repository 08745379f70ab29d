// Test-only helpers for the TCP transport tests: clusters of ranks as
// threads of the test process, and raw sockets that play one rank of a job
// byte by byte.
#ifndef TRAINYARD_TRANSPORT_TCP_TEST_UTIL_H_
#define TRAINYARD_TRANSPORT_TCP_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/tensor.h"
#include "transport/tcp_handshake.h"
#include "transport/tcp_transport.h"

namespace trainyard {

// A listener on an ephemeral loopback port; CHECK-fails when it cannot bind.
std::unique_ptr<PeerListener> MustListen(
    const PeerListenerOptions& options = PeerListenerOptions());

// N ranks as threads of this process, each with its own listener.
struct Cluster {
  std::vector<std::unique_ptr<PeerListener>> listeners;
  std::vector<std::unique_ptr<Transport>> ranks;
  std::vector<std::string> addresses;
};

// Connects the `n` ranks of `job` with `secret`; CHECK-fails when any rank
// fails to connect.
Cluster Connect(int n, const std::string& job, const std::string& secret = "");

// A float32 tensor of `shape` filled with normal samples from `seed`.
Tensor RandomFloats(Shape shape, uint64_t seed);

// Same dtype, shape and bytes.
bool BitwiseEqual(const Tensor& a, const Tensor& b);

// A raw socket to the listener, for fault injection.
class RawPeer {
 public:
  explicit RawPeer(const std::string& address);
  ~RawPeer();
  void Close();
  void Write(const std::string& s);
  // Everything until EOF (or the 5 s receive timeout).
  std::string ReadAll();
  // Reads one listener message into *body; "<no reply>" when the connection
  // closes (or 5 s pass) first.
  absl::StatusOr<HandshakeReplyCode> ReadMessage(std::string* body);
  // Reads the listener's reason for closing: its rejection, or what else
  // came instead.
  std::string ReadReply();
  // Sends `hello` (with a fresh nonce) and reads the challenge: the
  // listener's nonce, or "" after writing the reason to *error.
  std::string Hello(Handshake* hello, std::string* error);
  // The whole dialer side with `secret`: "" when the listener accepted and
  // proved the secret, else the reason.
  std::string Authenticate(const std::string& job, int from, int to,
                           const std::string& secret);

 private:
  int fd_ = -1;
};

// Rank 0 of a 2-rank job whose rank 1 is a raw socket in the test.
struct Impersonation {
  std::unique_ptr<Transport> rank0;
  std::unique_ptr<RawPeer> rank1;
};

// Connects rank 0 of `job` on `listener` while a RawPeer authenticates as
// rank 1 with the empty secret; CHECK-fails when either side fails.
Impersonation Impersonate(PeerListener* listener, const std::string& job,
                          absl::Duration io_timeout = absl::Seconds(5));

// The bytes of an activation frame from rank 1 to rank 0 carrying `t`, its
// checksum flipped when `corrupt_crc`.
std::string FrameBytes(const std::string& job, const Tensor& t,
                       bool corrupt_crc);

// Rank `rank` of a 2-rank job on `mine`, the other rank at `other`.
absl::StatusOr<std::unique_ptr<Transport>> ConnectRank(
    int rank, PeerListener* mine, const std::string& other,
    const std::string& job, const std::string& secret, absl::Duration timeout);

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_TCP_TEST_UTIL_H_
