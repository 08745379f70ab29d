#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/frame.h"
#include "transport/tcp_handshake.h"
#include "transport/tcp_test_util.h"
#include "transport/tcp_transport.h"

namespace trainyard {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A frame of any kind with a valid checksum.
std::string RawFrame(FrameKind kind, const std::string& job, int64_t step,
                     const std::vector<std::pair<std::string, Tensor>>& ts) {
  absl::StatusOr<std::string> h = EncodeFrameHeader(kind, job, step, 0, 0, ts);
  CHECK(h.ok()) << h.status();
  std::string frame = *h;
  for (const auto& [name, t] : ts) {
    frame.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  }
  const uint32_t crc = Crc32cExtend(0, frame.data(), frame.size());
  frame.append(reinterpret_cast<const char*>(&crc), 4);
  return frame;
}

// Rank 1 of a 2-rank job whose rank 0 is a raw socket in the test: it
// accepts rank 1's dial and answers the handshake, then the test writes
// whatever bytes it likes as rank 0.
struct FakeRank0 {
  int listen_fd = -1;
  int fd = -1;
  std::string address;
  std::unique_ptr<PeerListener> listener1;
  std::unique_ptr<Transport> rank1;

  explicit FakeRank0(const std::string& job) {
    listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(::bind(listen_fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)),
             0);
    CHECK_EQ(::listen(listen_fd, 4), 0);
    socklen_t len = sizeof(sa);
    ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&sa), &len);
    address = absl::StrCat("127.0.0.1:", ntohs(sa.sin_port));
    listener1 = MustListen();
    absl::StatusOr<std::unique_ptr<Transport>> t;
    std::thread connect([&] {
      TcpTransportOptions o;
      o.job_id = job;
      o.rank = 1;
      o.peer_addresses = {address, listener1->address()};
      o.connect_timeout = absl::Seconds(5);
      o.io_timeout = absl::Seconds(5);
      t = ConnectTcpTransport(listener1.get(), o);
    });
    fd = ::accept(listen_fd, nullptr, nullptr);
    CHECK_GE(fd, 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    // The listener's side of the handshake, with the empty secret.
    char prefix[kHandshakePrefixSize];
    CHECK_EQ(::recv(fd, prefix, sizeof(prefix), MSG_WAITALL),
             static_cast<ssize_t>(sizeof(prefix)));
    uint16_t job_len = 0;
    absl::StatusOr<Handshake> hello = DecodeHandshakePrefix(prefix, &job_len);
    CHECK(hello.ok()) << hello.status();
    std::string rest(HandshakeRestSize(job_len), '\0');
    CHECK_EQ(::recv(fd, rest.data(), rest.size(), MSG_WAITALL),
             static_cast<ssize_t>(rest.size()));
    CHECK(DecodeHandshakeRest(rest, &*hello).ok());
    CHECK_EQ(hello->job_id, job);
    const std::string nonce = NewHandshakeNonce();
    Write(EncodeHandshakeReply(HandshakeReplyCode::kChallenge, nonce));
    char proof[kHandshakeProofSize];
    CHECK_EQ(::recv(fd, proof, sizeof(proof), MSG_WAITALL),
             static_cast<ssize_t>(sizeof(proof)));
    CHECK(HandshakeMacMatches(
        HandshakeMac("", HandshakeRole::kDialer, *hello, nonce),
        *DecodeHandshakeProof(proof)));
    Write(EncodeHandshakeReply(
        HandshakeReplyCode::kAccepted,
        HandshakeMac("", HandshakeRole::kListener, *hello, nonce)));
    connect.join();
    CHECK(t.ok()) << t.status();
    rank1 = *std::move(t);
  }
  ~FakeRank0() {
    rank1.reset();
    ::close(fd);
    ::close(listen_fd);
  }
  void Write(const std::string& s) {
    CHECK_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL),
             static_cast<ssize_t>(s.size()));
  }
  // Reads one whole frame from rank 1 and returns its prefix.
  FramePrefix ReadFrame() {
    char prefix_bytes[kFramePrefixSize];
    CHECK_EQ(::recv(fd, prefix_bytes, sizeof(prefix_bytes), MSG_WAITALL),
             static_cast<ssize_t>(kFramePrefixSize));
    absl::StatusOr<FramePrefix> prefix = DecodeFramePrefix(prefix_bytes);
    CHECK(prefix.ok()) << prefix.status();
    std::string rest(prefix->header_size - kFramePrefixSize +
                         prefix->payload_size + kFrameTrailerSize,
                     '\0');
    CHECK_EQ(::recv(fd, rest.data(), rest.size(), MSG_WAITALL),
             static_cast<ssize_t>(rest.size()));
    return *prefix;
  }
};

Tensor Bytes(const std::string& s) {
  Tensor t = Tensor::Empty(DType::kUInt8, {static_cast<int64_t>(s.size())});
  std::memcpy(t.raw_data(), s.data(), s.size());
  return t;
}

// Rank 1 is blocked in AllReduceSum (its contribution has reached rank 0)
// when rank 0 sends `frame`; returns what AllReduceSum returned.
absl::Status AllReduceAnswer(FakeRank0* rank0, const std::string& frame) {
  absl::Status s;
  std::thread reducer([&] {
    std::vector<double> v = {1.0, 2.0};
    s = rank0->rank1->AllReduceSum(&v, absl::Seconds(10));
  });
  const FramePrefix contribution = rank0->ReadFrame();
  EXPECT_EQ(contribution.kind, FrameKind::kAllReduceContribution);
  EXPECT_EQ(contribution.chunk, 0);
  const absl::Time start = absl::Now();
  rank0->Write(frame);
  reducer.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  return s;
}

TEST(TcpTransportMalformedFrameTest, AllReduceErrorWithoutTensorIsDataLoss) {
  const std::string job = "no-tensor";
  FakeRank0 rank0(job);
  const absl::Status s =
      AllReduceAnswer(&rank0, RawFrame(FrameKind::kAllReduceError, job, 0, {}));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("rank 0 (" + rank0.address + ")"),
                    HasSubstr("malformed all-reduce-error frame")));
  // Later calls fail the same way.
  EXPECT_THAT(rank0.rank1->Send(0, Message()).message(),
              HasSubstr("rank 0 (" + rank0.address + ")"));
}

TEST(TcpTransportMalformedFrameTest, EveryInternalKindChecksItsTensors) {
  const Tensor one_double = Tensor::Empty(DType::kFloat64, {2});
  const struct {
    const char* what;
    FrameKind kind;
    std::vector<std::pair<std::string, Tensor>> tensors;
    const char* expect;
  } cases[] = {
      {"error as int64",
       FrameKind::kAllReduceError,
       {{"message", Tensor::Empty(DType::kInt64, {3})}},
       "malformed all-reduce-error frame"},
      {"error 2-d",
       FrameKind::kAllReduceError,
       {{"message", Tensor::Empty(DType::kUInt8, {2, 3})}},
       "malformed all-reduce-error frame"},
      {"error too long",
       FrameKind::kAllReduceError,
       {{"message", Bytes(std::string(kMaxAbortMessageLength + 1, 'x'))}},
       "limit 4096"},
      {"error and more",
       FrameKind::kAllReduceError,
       {{"message", Bytes("a")}, {"message", Bytes("b")}},
       "malformed all-reduce-error frame"},
      {"result without tensor",
       FrameKind::kAllReduceResult,
       {},
       "malformed all-reduce-result frame"},
      {"result as float",
       FrameKind::kAllReduceResult,
       {{"values", Tensor::Zeros(DType::kFloat32, {2})}},
       "malformed all-reduce-result frame"},
      {"result misnamed",
       FrameKind::kAllReduceResult,
       {{"sums", one_double}},
       "malformed all-reduce-result frame"},
      {"contribution to rank 1",
       FrameKind::kAllReduceContribution,
       {{"values", one_double}},
       "only rank 0"},
      {"goodbye with a tensor",
       FrameKind::kGoodbye,
       {{"x", Bytes("x")}},
       "malformed goodbye frame"},
  };
  int i = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string job = absl::StrCat("kinds-", i++);
    FakeRank0 rank0(job);
    const absl::Status s =
        AllReduceAnswer(&rank0, RawFrame(c.kind, job, 0, c.tensors));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), AllOf(HasSubstr("rank 0 (" + rank0.address + ")"),
                                   HasSubstr(c.expect)));
  }
}

TEST(TcpTransportMalformedFrameTest, WellFormedAllReduceErrorCarriesTheReason) {
  const std::string job = "good-error";
  FakeRank0 rank0(job);
  const absl::Status s = AllReduceAnswer(
      &rank0, RawFrame(FrameKind::kAllReduceError, job, 0,
                       {{"message", Bytes("rank 3 sent 5 values")}}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(),
              HasSubstr("rank 0 failed the round: rank 3 sent 5 values"));
}

}  // namespace
}  // namespace trainyard
