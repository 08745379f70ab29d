#include "transport/peer_dialer.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "net/address.h"
#include "transport/tcp_handshake.h"

namespace trainyard {
namespace {

const char* ReplyName(HandshakeReplyCode code) {
  switch (code) {
    case HandshakeReplyCode::kAccepted:
      return "an accept";
    case HandshakeReplyCode::kRejected:
      return "a rejection";
    case HandshakeReplyCode::kChallenge:
      return "a challenge";
  }
  return "a reply";
}

// The listener's reason as it goes into logs and job reasons: it comes from
// a peer not yet authenticated, so control bytes are escaped.
std::string EscapeControlBytes(const std::string& body) {
  std::string shown;
  for (unsigned char c : body) {
    if (c < 0x20 || c == 0x7f) {
      absl::StrAppend(&shown, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      shown.push_back(static_cast<char>(c));
    }
  }
  return shown;
}

// Reads one listener message and returns its body if it is a `want`. A
// rejection is Unavailable "handshake rejected: <the listener's reason>".
absl::StatusOr<std::string> ReadHandshakeReply(int fd, HandshakeReplyCode want,
                                               absl::Time deadline,
                                               int stop_fd) {
  char prefix[kHandshakeReplyPrefixSize];
  size_t got = 0;
  RETURN_IF_ERROR(
      ReadFull(fd, prefix, sizeof(prefix), deadline, stop_fd, &got));
  HandshakeReplyCode code;
  uint16_t body_len = 0;
  RETURN_IF_ERROR(DecodeHandshakeReplyPrefix(prefix, &code, &body_len));
  std::string body(body_len, '\0');
  RETURN_IF_ERROR(
      ReadFull(fd, body.data(), body.size(), deadline, stop_fd, &got));
  if (code == HandshakeReplyCode::kRejected) {
    return absl::UnavailableError(
        absl::StrCat("handshake rejected: ", EscapeControlBytes(body)));
  }
  if (code != want) {
    return absl::DataLossError(
        absl::StrCat("expected ", ReplyName(want), ", got ", ReplyName(code)));
  }
  return body;
}

// The dialer's side of the handshake on a connected socket. Errors say
// which step failed; a rejection carries the listener's reason.
absl::Status DialHandshake(int fd, Handshake hello, const std::string& secret,
                           absl::Time deadline, int stop_fd) {
  hello.nonce = NewHandshakeNonce();
  auto step = [](const char* what, const absl::Status& s) {
    if (s.ok() || absl::IsCancelled(s) ||
        absl::StartsWith(s.message(), "handshake rejected: ")) {
      return s;
    }
    return absl::Status(s.code(),
                        absl::StrCat("handshake: ", what, ": ", s.message()));
  };
  RETURN_IF_ERROR(
      step("sending the hello",
           WriteString(fd, EncodeHandshake(hello), deadline, stop_fd)));
  absl::StatusOr<std::string> listener_nonce =
      ReadHandshakeReply(fd, HandshakeReplyCode::kChallenge, deadline, stop_fd);
  RETURN_IF_ERROR(step("reading the challenge", listener_nonce.status()));
  const std::string proof = EncodeHandshakeProof(
      HandshakeMac(secret, HandshakeRole::kDialer, hello, *listener_nonce));
  RETURN_IF_ERROR(
      step("sending the proof", WriteString(fd, proof, deadline, stop_fd)));
  absl::StatusOr<std::string> listener_mac =
      ReadHandshakeReply(fd, HandshakeReplyCode::kAccepted, deadline, stop_fd);
  RETURN_IF_ERROR(step("reading the accept", listener_mac.status()));
  if (!HandshakeMacMatches(HandshakeMac(secret, HandshakeRole::kListener, hello,
                                        *listener_nonce),
                           *listener_mac)) {
    return absl::UnauthenticatedError(
        "handshake: data-plane authentication of the listener failed: its "
        "proof does not match this job's secret (a different secret, or "
        "another process at that address)");
  }
  return absl::OkStatus();
}

// What a dial reports after an attempt failed with `s`, `last` being what
// it reported before: a deadline that cuts an attempt short says less than
// why an earlier attempt failed (refused, or the listener's proof did not
// match), so that reason is kept.
absl::Status AfterFailedAttempt(absl::Status last, absl::Status s) {
  if (absl::IsDeadlineExceeded(s) && !absl::IsDeadlineExceeded(last)) {
    return last;
  }
  return s;
}

}  // namespace

absl::StatusOr<Fd> DialPeer(const std::string& address, const Handshake& hello,
                            const std::string& secret, absl::Time deadline,
                            int stop_fd) {
  ASSIGN_OR_RETURN(sockaddr_in sa, ResolveIpv4(address));
  absl::Status last = absl::DeadlineExceededError("no attempt made");
  const absl::Status cancelled =
      absl::CancelledError("connection setup cancelled");
  while (absl::Now() < deadline) {
    if (IsSignalled(stop_fd)) return cancelled;
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) {
      return absl::InternalError(absl::StrCat("socket: ", ErrnoText(errno)));
    }
    SetNoDelayAndNonBlocking(fd.get());
    int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    if (rc != 0 && errno == EINPROGRESS) {
      absl::Status s = WaitFd(fd.get(), POLLOUT, deadline, stop_fd);
      if (absl::IsCancelled(s)) return cancelled;
      if (!s.ok()) {
        last = AfterFailedAttempt(
            last, absl::DeadlineExceededError("connect timed out"));
        break;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      last =
          absl::UnavailableError(absl::StrCat("connect: ", ErrnoText(errno)));
      if (SleepUnlessSignalled(absl::Milliseconds(20), stop_fd)) {
        return cancelled;
      }
      continue;
    }
    const absl::Status s =
        DialHandshake(fd.get(), hello, secret, deadline, stop_fd);
    if (absl::IsCancelled(s)) return cancelled;
    if (s.ok()) return fd;
    last = AfterFailedAttempt(last, s);
    if (SleepUnlessSignalled(absl::Milliseconds(50), stop_fd)) return cancelled;
  }
  return last;
}

}  // namespace trainyard
