// Test-only: a raw client socket to a PeerListener, for fault injection and
// fuzzing of the handshake (transport/tcp_test_util.cc,
// transport/tcp_handshake_fuzz_test.cc).
#ifndef TRAINYARD_TRANSPORT_TEST_SOCKET_H_
#define TRAINYARD_TRANSPORT_TEST_SOCKET_H_

#include <string>

#include "absl/status/status.h"
#include "transport/frame.h"

namespace trainyard {

// A blocking TCP socket connected to `address` ("127.0.0.1:port"), whose
// sends and receives give up after `timeout_s` seconds. CHECK-fails when it
// cannot connect (a broken test, not the code under test).
int ConnectTestSocket(const std::string& address, int timeout_s);

// Reads one listener message (challenge, accept or rejection). Unavailable
// when the connection closes first or mid-message, DeadlineExceeded when
// the receive timeout passes, DataLoss when the prefix does not decode.
absl::Status ReadListenerMessage(int fd, HandshakeReplyCode* code,
                                 std::string* body);

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_TEST_SOCKET_H_
