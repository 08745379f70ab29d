#include "transport/tcp_test_util.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "core/random.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "transport/frame.h"
#include "transport/test_socket.h"

namespace trainyard {

std::unique_ptr<PeerListener> MustListen(const PeerListenerOptions& options) {
  auto l = PeerListener::Listen("127.0.0.1:0", options);
  CHECK(l.ok()) << l.status();
  return *std::move(l);
}

Cluster Connect(int n, const std::string& job, const std::string& secret) {
  Cluster c;
  for (int r = 0; r < n; ++r) {
    c.listeners.push_back(MustListen());
    c.addresses.push_back(c.listeners.back()->address());
  }
  std::vector<absl::StatusOr<std::unique_ptr<Transport>>> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      TcpTransportOptions o;
      o.job_id = job;
      o.rank = r;
      o.peer_addresses = c.addresses;
      o.secret = secret;
      o.connect_timeout = absl::Seconds(5);
      o.io_timeout = absl::Seconds(5);
      results[r] = ConnectTcpTransport(c.listeners[r].get(), o);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    CHECK(results[r].ok()) << results[r].status();
    c.ranks.push_back(*std::move(results[r]));
  }
  return c;
}

Tensor RandomFloats(Shape shape, uint64_t seed) {
  Tensor t = Tensor::Empty(DType::kFloat32, shape);
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<float>()[i] = static_cast<float>(rng.Normal());
  }
  return t;
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 ||
          std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

RawPeer::RawPeer(const std::string& address)
    : fd_(ConnectTestSocket(address, 5)) {}

RawPeer::~RawPeer() { Close(); }

void RawPeer::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RawPeer::Write(const std::string& s) {
  ASSERT_EQ(::send(fd_, s.data(), s.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(s.size()));
}

std::string RawPeer::ReadAll() {
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) return out;
    out.append(buf, n);
  }
}

absl::StatusOr<HandshakeReplyCode> RawPeer::ReadMessage(std::string* body) {
  HandshakeReplyCode code;
  absl::Status s = ReadListenerMessage(fd_, &code, body);
  if (absl::IsDeadlineExceeded(s)) return absl::UnavailableError("<no reply>");
  if (!s.ok()) return s;
  return code;
}

std::string RawPeer::ReadReply() {
  std::string body;
  absl::StatusOr<HandshakeReplyCode> code = ReadMessage(&body);
  if (!code.ok()) return std::string(code.status().message());
  if (*code != HandshakeReplyCode::kRejected) {
    return absl::StrCat("<reply code ", static_cast<int>(*code), ">");
  }
  return body;
}

std::string RawPeer::Hello(Handshake* hello, std::string* error) {
  hello->nonce = NewHandshakeNonce();
  Write(EncodeHandshake(*hello));
  std::string body;
  absl::StatusOr<HandshakeReplyCode> code = ReadMessage(&body);
  if (!code.ok()) {
    *error = std::string(code.status().message());
  } else if (*code != HandshakeReplyCode::kChallenge) {
    *error = *code == HandshakeReplyCode::kRejected
                 ? body
                 : absl::StrCat("<reply code ", static_cast<int>(*code), ">");
  } else {
    return body;
  }
  return "";
}

std::string RawPeer::Authenticate(const std::string& job, int from, int to,
                                  const std::string& secret) {
  Handshake hello{job, from, to};
  std::string error;
  const std::string listener_nonce = Hello(&hello, &error);
  if (listener_nonce.empty()) return error;
  Write(EncodeHandshakeProof(
      HandshakeMac(secret, HandshakeRole::kDialer, hello, listener_nonce)));
  std::string body;
  absl::StatusOr<HandshakeReplyCode> code = ReadMessage(&body);
  if (!code.ok()) return std::string(code.status().message());
  if (*code == HandshakeReplyCode::kRejected) return body;
  if (!HandshakeMacMatches(
          HandshakeMac(secret, HandshakeRole::kListener, hello, listener_nonce),
          body)) {
    return "<listener proof does not match>";
  }
  return "";
}

Impersonation Impersonate(PeerListener* listener, const std::string& job,
                          absl::Duration io_timeout) {
  Impersonation imp;
  absl::StatusOr<std::unique_ptr<Transport>> t;
  std::thread connect([&] {
    TcpTransportOptions o;
    o.job_id = job;
    o.rank = 0;
    o.peer_addresses = {listener->address(), "127.0.0.1:1"};
    o.connect_timeout = absl::Seconds(5);
    o.io_timeout = io_timeout;
    t = ConnectTcpTransport(listener, o);
  });
  imp.rank1 = std::make_unique<RawPeer>(listener->address());
  const std::string reply = imp.rank1->Authenticate(job, 1, 0, /*secret=*/"");
  connect.join();
  CHECK_EQ(reply, "");
  CHECK(t.ok()) << t.status();
  imp.rank0 = *std::move(t);
  return imp;
}

std::string FrameBytes(const std::string& job, const Tensor& t,
                       bool corrupt_crc) {
  std::string h =
      *EncodeFrameHeader(FrameKind::kActivation, job, 1, 0, 0, {{"x", t}});
  std::string payload(static_cast<const char*>(t.raw_data()), t.nbytes());
  uint32_t crc = Crc32cExtend(Crc32cExtend(0, h.data(), h.size()),
                              payload.data(), payload.size());
  if (corrupt_crc) crc ^= 1;
  std::string trailer(4, '\0');
  std::memcpy(trailer.data(), &crc, 4);
  return h + payload + trailer;
}

absl::StatusOr<std::unique_ptr<Transport>> ConnectRank(
    int rank, PeerListener* mine, const std::string& other,
    const std::string& job, const std::string& secret, absl::Duration timeout) {
  TcpTransportOptions o;
  o.job_id = job;
  o.rank = rank;
  o.peer_addresses = rank == 0
                         ? std::vector<std::string>{mine->address(), other}
                         : std::vector<std::string>{other, mine->address()};
  o.secret = secret;
  o.connect_timeout = timeout;
  o.io_timeout = absl::Seconds(5);
  return ConnectTcpTransport(mine, o);
}

}  // namespace trainyard
