#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "core/sha256.h"
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

absl::Status RecvError(Transport* t) {
  const absl::Time start = absl::Now();
  absl::Status s = t->Recv(1, absl::Seconds(10)).status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << s;
  return s;
}

class FaultInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PeerListenerOptions o;
    o.handshake_timeout = absl::Milliseconds(500);
    o.unknown_job_timeout = absl::Milliseconds(200);
    listener_ = MustListen(o);
  }
  void TearDown() override {
    // The listener still serves a real job after every fault.
    auto imp = Impersonate(listener_.get(), "after-fault");
    imp.rank1->Write(FrameBytes("after-fault", RandomFloats({2, 3}, 9), false));
    auto m = imp.rank0->Recv(1, absl::Seconds(5));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(BitwiseEqual(m->tensors[0].second, RandomFloats({2, 3}, 9)));
  }
  std::unique_ptr<PeerListener> listener_;
};

// Rank 0 of job `job` on `listener` with `secret`, connecting in the
// background until the test's real rank 1 (a RawPeer) comes.
struct WaitingRank0 {
  WaitingRank0(PeerListener* listener, const std::string& job,
               const std::string& secret)
      : thread([=] {
          t = ConnectRank(0, listener, "127.0.0.1:1", job, secret,
                          absl::Seconds(5));
        }) {}
  Transport* Join() {
    thread.join();
    CHECK(t.ok()) << t.status();
    return t->get();
  }
  absl::StatusOr<std::unique_ptr<Transport>> t;
  std::thread thread;
};

TEST_F(FaultInjectionTest, GarbageProofIsRejectedBeforeAnyFrameIsRead) {
  const std::string secret = RandomBytes(32);
  WaitingRank0 rank0(listener_.get(), "proof", secret);
  // A valid hello, a made-up proof and a frame right behind it.
  RawPeer attacker(listener_->address());
  Handshake hello{"proof", 1, 0};
  std::string error;
  ASSERT_NE(attacker.Hello(&hello, &error), "") << error;
  attacker.Write(EncodeHandshakeProof(RandomBytes(32)) +
                 FrameBytes("proof", RandomFloats({2, 2}, 66), false));
  EXPECT_EQ(attacker.ReadReply(),
            "rank 1 of job \"proof\" for rank 0: data-plane authentication "
            "failed (wrong or missing job secret)");
  // Not even a proof's shape.
  RawPeer garbage(listener_->address());
  ASSERT_NE(garbage.Hello(&hello, &error), "") << error;
  garbage.Write(std::string(kHandshakeProofSize, 'Z'));
  EXPECT_THAT(garbage.ReadReply(),
              HasSubstr("rank 1 of job \"proof\" for rank 0: data-plane "
                        "authentication failed: bad handshake proof magic"));
  // The real rank 1 still connects; rank 0 gets its frame, not the
  // attacker's.
  RawPeer real(listener_->address());
  ASSERT_EQ(real.Authenticate("proof", 1, 0, secret), "");
  Transport* t0 = rank0.Join();
  real.Write(FrameBytes("proof", RandomFloats({2, 2}, 7), false));
  auto m = t0->Recv(1, absl::Seconds(5));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(BitwiseEqual(m->tensors[0].second, RandomFloats({2, 2}, 7)));
}

TEST_F(FaultInjectionTest, SilenceAfterTheChallengeTimesOut) {
  WaitingRank0 rank0(listener_.get(), "mute", "s");
  RawPeer mute(listener_->address());
  Handshake hello{"mute", 1, 0};
  std::string error;
  ASSERT_NE(mute.Hello(&hello, &error), "") << error;
  mute.Write("TYHP");
  EXPECT_EQ(mute.ReadReply(),
            "rank 1 of job \"mute\" for rank 0: handshake: no proof of the job "
            "secret within 500ms (got 4 of 36 bytes)");
  RawPeer real(listener_->address());
  ASSERT_EQ(real.Authenticate("mute", 1, 0, "s"), "");
  Transport* t0 = rank0.Join();
  real.Write(FrameBytes("mute", RandomFloats({1}, 8), false));
  EXPECT_TRUE(t0->Recv(1, absl::Seconds(5)).ok());
}

// A version-2 dialer (no nonce, no proof) learns why at once.
TEST_F(FaultInjectionTest, OlderHandshakeVersionIsRejectedClearly) {
  std::string v2 = EncodeHandshake({"old", 1, 0});
  const uint16_t two = 2;
  std::memcpy(&v2[4], &two, 2);
  v2.resize(kHandshakePrefixSize);
  v2 += "old";  // version 2: the job id right after the prefix
  RawPeer old(listener_->address());
  old.Write(v2);
  // Not a timeout waiting for the nonce it will never send.
  EXPECT_THAT(old.ReadReply(),
              HasSubstr("unsupported handshake version 2 (expected 3"));
}

TEST_F(FaultInjectionTest, GarbageHandshakeIsRejectedWithReason) {
  RawPeer raw(listener_->address());
  raw.Write("GET / HTTP/1.1\r\n\r\n");
  EXPECT_THAT(raw.ReadReply(), HasSubstr("bad handshake magic 0x20544547"));
}

TEST_F(FaultInjectionTest, SilentConnectionTimesOutInHandshake) {
  RawPeer raw(listener_->address());
  raw.Write("TY");
  EXPECT_THAT(raw.ReadReply(), HasSubstr("handshake: timed out after 2 of 16"));
}

TEST_F(FaultInjectionTest, HandshakeForUnknownJobIsRejectedAfterTimeout) {
  RawPeer raw(listener_->address());
  const absl::Time start = absl::Now();
  raw.Write(EncodeHandshake({"no-such-job", 1, 0}));
  EXPECT_THAT(raw.ReadReply(),
              AllOf(HasSubstr("job \"no-such-job\" for rank 0"),
                    HasSubstr("no such job/rank registered")));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
}

TEST_F(FaultInjectionTest, GarbageFrameMagic) {
  auto imp = Impersonate(listener_.get(), "magic");
  imp.rank1->Write(std::string(64, 'Z'));
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("rank 1 (127.0.0.1:1)"),
                                 HasSubstr("bad frame magic")));
  // Later calls fail the same way.
  EXPECT_THAT(imp.rank0->Send(1, Message()).message(),
              HasSubstr("bad frame magic"));
}

TEST_F(FaultInjectionTest, FrameOfAnOlderReleaseNamesBothVersions) {
  auto imp = Impersonate(listener_.get(), "old");
  std::string frame = FrameBytes("old", RandomFloats({2}, 8), false);
  const uint16_t two = 2;  // a release before the chunk field
  std::memcpy(&frame[4], &two, 2);
  imp.rank1->Write(frame);
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(),
              HasSubstr("rank 1 (127.0.0.1:1): unsupported frame version 2 "
                        "(expected 3; the sender runs an older Trainyard "
                        "release)"));
}

TEST_F(FaultInjectionTest, HeaderPromisingMoreBytesThenClose) {
  auto imp = Impersonate(listener_.get(), "truncated");
  std::string frame =
      FrameBytes("truncated", RandomFloats({1024, 1024}, 3), false);
  const std::string header_and_1k =
      frame.substr(0, frame.size() - 4 - (4 << 20) + 1024);
  imp.rank1->Write(header_and_1k);
  imp.rank1->Close();
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat(
                  "rank 1 (127.0.0.1:1): connection closed in the middle of "
                  "a frame (got ",
                  header_and_1k.size(), " of ", frame.size(), " bytes)")));
}

TEST_F(FaultInjectionTest, CorruptedChecksum) {
  auto imp = Impersonate(listener_.get(), "crc");
  imp.rank1->Write(FrameBytes("crc", RandomFloats({5, 3}, 4), true));
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("rank 1 (127.0.0.1:1)"),
                                 HasSubstr("checksum mismatch")));
}

TEST_F(FaultInjectionTest, OversizedFrameClaimIsRejectedBeforeReading) {
  auto imp = Impersonate(listener_.get(), "huge");
  std::string frame = FrameBytes("huge", RandomFloats({2}, 5), false);
  const uint64_t claim = uint64_t{3} << 30;
  std::memcpy(&frame[32], &claim, 8);
  imp.rank1->Write(frame.substr(0, kFramePrefixSize));
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(),
              HasSubstr("rank 1 (127.0.0.1:1): frame claims a payload of "
                        "3221225472 bytes, limit 2147483648"));
}

TEST_F(FaultInjectionTest, FrameForAnotherJob) {
  auto imp = Impersonate(listener_.get(), "mine");
  imp.rank1->Write(FrameBytes("theirs", RandomFloats({2}, 6), false));
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_THAT(s.message(),
              HasSubstr("rank 1 (127.0.0.1:1): received a frame for job "
                        "\"theirs\"; this transport serves job \"mine\""));
}

TEST_F(FaultInjectionTest, StalledFrameTimesOut) {
  auto imp = Impersonate(listener_.get(), "stall", absl::Seconds(1));
  // A partial prefix, then silence.
  std::string frame = FrameBytes("stall", RandomFloats({2}, 7), false);
  imp.rank1->Write(frame.substr(0, 10));
  const absl::Time start = absl::Now();
  absl::Status s = imp.rank0->Recv(1, absl::Seconds(10)).status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(900));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(),
              HasSubstr("rank 1 (127.0.0.1:1): frame not complete "
                        "within 1s (got 10 of a frame prefix of 40 bytes)"));
}

TEST_F(FaultInjectionTest, PeerThatDiesWithoutAbortStillSaysNoGoodbye) {
  auto imp = Impersonate(listener_.get(), "crash");
  imp.rank1->Close();  // a process crash: the kernel closes its sockets
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(),
              HasSubstr("rank 1 (127.0.0.1:1): connection closed by the peer "
                        "between frames (no goodbye: the peer process died "
                        "or aborted)"));
}

TEST_F(FaultInjectionTest, AbortFrameOnTheWire) {
  auto imp = Impersonate(listener_.get(), "wire");
  const absl::Time start = absl::Now();
  imp.rank0->Abort(absl::CancelledError("cancelled by request: wire"));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  const std::string bytes = imp.rank1->ReadAll();
  ASSERT_GE(bytes.size(), kFramePrefixSize);
  auto prefix = DecodeFramePrefix(bytes.data());
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  EXPECT_EQ(prefix->kind, FrameKind::kAbort);
  EXPECT_EQ(prefix->chunk, 0);
  ASSERT_EQ(bytes.size(),
            prefix->header_size + prefix->payload_size + kFrameTrailerSize);
  auto header = DecodeFrameHeader(
      *prefix, absl::string_view(bytes).substr(
                   kFramePrefixSize, prefix->header_size - kFramePrefixSize));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->job_id, "wire");
  ASSERT_EQ(header->tensors.size(), 2u);
  const char* payload = bytes.data() + prefix->header_size;
  int32_t code;
  std::memcpy(&code, payload, 4);
  EXPECT_EQ(code, static_cast<int32_t>(absl::StatusCode::kCancelled));
  EXPECT_EQ(std::string(payload + 4, prefix->payload_size - 4),
            "cancelled by request: wire");
  uint32_t crc;
  std::memcpy(&crc, bytes.data() + bytes.size() - 4, 4);
  EXPECT_EQ(crc, Crc32cExtend(0, bytes.data(), bytes.size() - 4));
}

TEST_F(FaultInjectionTest, AbortDoesNotWaitForAPeerThatStoppedReading) {
  auto imp = Impersonate(listener_.get(), "stuck");
  // The raw peer never reads: 64 MiB fill both socket buffers and leave the
  // sender blocked in the middle of a frame.
  for (int i = 0; i < 4; ++i) {
    Message m;
    m.tensors = {{"x", Tensor::Zeros(DType::kFloat32, {4 << 20})}};
    ASSERT_TRUE(imp.rank0->Send(1, m).ok());
  }
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  imp.rank0->Abort(absl::InternalError("stage 0 failed: stuck"));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(600));
  auto own = imp.rank0->Recv(1, absl::Seconds(1)).status();
  EXPECT_EQ(own.code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace trainyard
