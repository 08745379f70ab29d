#include "transport/test_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>

#include "absl/strings/numbers.h"
#include "glog/logging.h"
#include "net/address.h"

namespace trainyard {

int ConnectTestSocket(const std::string& address, int timeout_s) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  CHECK_GE(fd, 0);
  absl::StatusOr<sockaddr_in> resolved = ResolveIpv4(address);
  CHECK(resolved.ok()) << resolved.status();
  sockaddr_in sa = *resolved;
  timeval tv{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  CHECK_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0)
      << address;
  return fd;
}

absl::Status ReadListenerMessage(int fd, HandshakeReplyCode* code,
                                 std::string* body) {
  char prefix[kHandshakeReplyPrefixSize];
  const ssize_t n = ::recv(fd, prefix, sizeof(prefix), MSG_WAITALL);
  if (n != static_cast<ssize_t>(sizeof(prefix))) {
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return absl::DeadlineExceededError("<no reply in time>");
    }
    return absl::UnavailableError("<no reply>");
  }
  uint16_t len = 0;
  absl::Status s = DecodeHandshakeReplyPrefix(prefix, code, &len);
  if (!s.ok()) return absl::DataLossError(s.message());
  body->assign(len, '\0');
  if (len > 0 && ::recv(fd, body->data(), len, MSG_WAITALL) != len) {
    return absl::UnavailableError("<truncated reply>");
  }
  return absl::OkStatus();
}

}  // namespace trainyard
