#include "transport/frame.h"

#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(FrameTest, HeaderRoundTrip) {
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"x", Tensor::Zeros(DType::kFloat32, {3, 5})},
      {"labels", Tensor::Zeros(DType::kInt64, {7})},
      {"empty", Tensor::Zeros(DType::kUInt8, {0, 4})}};
  auto h = EncodeFrameHeader(FrameKind::kGradient, "job-1", 42, -3, 5, ts);
  ASSERT_TRUE(h.ok()) << h.status();
  auto prefix = DecodeFramePrefix(h->data());
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  EXPECT_EQ(prefix->kind, FrameKind::kGradient);
  EXPECT_EQ(prefix->header_size, h->size());
  EXPECT_EQ(prefix->step, 42);
  EXPECT_EQ(prefix->microbatch, -3);
  EXPECT_EQ(prefix->chunk, 5);
  EXPECT_EQ(prefix->payload_size, 3 * 5 * 4 + 7 * 8);
  auto header = DecodeFrameHeader(
      *prefix, absl::string_view(*h).substr(kFramePrefixSize));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->job_id, "job-1");
  ASSERT_EQ(header->tensors.size(), 3u);
  EXPECT_EQ(header->tensors[1].name, "labels");
  EXPECT_EQ(header->tensors[1].dtype, DType::kInt64);
  EXPECT_EQ(header->tensors[0].shape, (Shape{3, 5}));
  EXPECT_EQ(header->tensors[2].shape, (Shape{0, 4}));
}

TEST(FrameTest, EncodeRejectsOverLimits) {
  std::vector<std::pair<std::string, Tensor>> many;
  for (int i = 0; i <= kMaxFrameTensors; ++i) {
    many.push_back({"t", Tensor::Zeros(DType::kFloat32, {1})});
  }
  auto h = EncodeFrameHeader(FrameKind::kActivation, "j", 0, 0, 0, many);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(h.status().message(), HasSubstr("65 tensors, limit 64"));

  std::vector<std::pair<std::string, Tensor>> deep = {
      {"deep", Tensor::Zeros(DType::kFloat32, {1, 1, 1, 1, 1, 1, 1, 1, 1})}};
  h = EncodeFrameHeader(FrameKind::kActivation, "j", 0, 0, 0, deep);
  EXPECT_THAT(h.status().message(), HasSubstr("\"deep\" has 9 dims, limit 8"));

  std::vector<std::pair<std::string, Tensor>> long_name = {
      {std::string(300, 'n'), Tensor::Zeros(DType::kFloat32, {1})}};
  h = EncodeFrameHeader(FrameKind::kActivation, "j", 0, 0, 0, long_name);
  EXPECT_THAT(h.status().message(), HasSubstr("300 bytes, limit 256"));
}

TEST(FrameTest, ChunkRoundTripsUpTo65535) {
  const std::vector<std::pair<std::string, Tensor>> ts = {
      {"x", Tensor::Zeros(DType::kFloat32, {2})}};
  for (int32_t chunk : {0, 3, 256, kMaxFrameChunk}) {
    auto h = EncodeFrameHeader(FrameKind::kActivation, "j", 1, 2, chunk, ts);
    ASSERT_TRUE(h.ok()) << h.status();
    uint16_t on_wire;  // u16 at offset 30
    std::memcpy(&on_wire, h->data() + 30, 2);
    EXPECT_EQ(on_wire, chunk);
    auto prefix = DecodeFramePrefix(h->data());
    ASSERT_TRUE(prefix.ok()) << prefix.status();
    EXPECT_EQ(prefix->chunk, chunk);
    EXPECT_EQ(prefix->microbatch, 2);  // the neighbours are untouched
    EXPECT_EQ(prefix->job_id_length, 1);
    EXPECT_EQ(prefix->payload_size, 8u);
  }
}

TEST(FrameTest, EncodeRejectsChunkOutsideU16) {
  for (int32_t chunk : {-1, kMaxFrameChunk + 1}) {
    auto h = EncodeFrameHeader(FrameKind::kActivation, "j", 0, 0, chunk, {});
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(h.status().message(),
                HasSubstr(absl::StrCat(
                    "frame: chunk must be in [0, 65535], got ", chunk)));
  }
}

// The worked example of docs/TRANSPORT_FRAME.md, byte for byte.
TEST(FrameTest, PrefixMatchesTheSpecExample) {
  auto h =
      EncodeFrameHeader(FrameKind::kActivation, "j1", 3, 0, 1,
                        {{"x", Tensor::Zeros(DType::kFloat32, {1024, 1024})}});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->size(), 63u);
  EXPECT_EQ(absl::BytesToHexString(h->substr(0, kFramePrefixSize)),
            "5459465203000000"    // magic "TYFR", version 3, kind 0
            "3f00000001000000"    // header_size 63, num_tensors 1
            "0300000000000000"    // step 3
            "0000000002000100"    // microbatch 0, job_id_len 2, chunk 1
            "0000400000000000");  // payload_size 4194304
}

std::string ValidHeader() {
  return *EncodeFrameHeader(FrameKind::kActivation, "j", 1, 2, 0,
                            {{"x", Tensor::Zeros(DType::kFloat32, {2, 2})}});
}

TEST(FrameTest, PrefixRejectsBadMagicVersionKindAndSizes) {
  std::string h = ValidHeader();
  std::string bad = h;
  bad[0] = 'X';
  EXPECT_THAT(DecodeFramePrefix(bad.data()).status().message(),
              HasSubstr("bad frame magic"));
  bad = h;
  bad[4] = 9;
  EXPECT_THAT(DecodeFramePrefix(bad.data()).status().message(),
              HasSubstr("unsupported frame version 9 (expected 3; the sender "
                        "runs a newer Trainyard release)"));
  bad = h;
  bad[6] = 77;
  EXPECT_THAT(DecodeFramePrefix(bad.data()).status().message(),
              HasSubstr("unknown frame kind 77"));
  bad = h;
  const uint64_t huge = kMaxFramePayloadBytes + 1;
  std::memcpy(&bad[32], &huge, 8);
  auto p = DecodeFramePrefix(bad.data());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(p.status().message(), HasSubstr("payload of 2147483649 bytes"));
  bad = h;
  const uint32_t tensors = 1000;
  std::memcpy(&bad[12], &tensors, 4);
  EXPECT_THAT(DecodeFramePrefix(bad.data()).status().message(),
              HasSubstr("1000 tensors, limit 64"));
  bad = h;
  const uint32_t header_size = 1 << 30;
  std::memcpy(&bad[8], &header_size, 4);
  EXPECT_THAT(DecodeFramePrefix(bad.data()).status().message(),
              HasSubstr("header of 1073741824 bytes"));
}

// Version 2 had a reserved 0 where the chunk is: a peer of the release
// before cannot be read, and the error says so.
TEST(FrameTest, VersionTwoFrameIsRejectedNamingBothVersions) {
  std::string old = ValidHeader();
  const uint16_t two = 2;
  std::memcpy(&old[4], &two, 2);
  const absl::Status s = DecodeFramePrefix(old.data()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(),
            "unsupported frame version 2 (expected 3; the sender runs an "
            "older Trainyard release)");
}

TEST(FrameTest, HeaderRejectsPayloadMismatchAndBadDims) {
  std::string h = ValidHeader();
  std::string bad = h;
  const uint64_t payload = 17;  // the tensor holds 16
  std::memcpy(&bad[32], &payload, 8);
  auto prefix = DecodeFramePrefix(bad.data());
  ASSERT_TRUE(prefix.ok());
  auto header = DecodeFrameHeader(
      *prefix, absl::string_view(bad).substr(kFramePrefixSize));
  EXPECT_THAT(header.status().message(),
              HasSubstr("tensors hold 16 bytes, payload size says 17"));

  bad = h;
  const int64_t negative = -5;
  // Prefix (40) + job id "j" (1) + name_len/dtype/ndim (4) = first dim.
  std::memcpy(&bad[45], &negative, 8);
  prefix = DecodeFramePrefix(bad.data());
  header = DecodeFrameHeader(*prefix,
                             absl::string_view(bad).substr(kFramePrefixSize));
  EXPECT_THAT(header.status().message(), HasSubstr("dimension 0 = -5"));
}

TEST(HandshakeTest, HelloRoundTripAndRejects) {
  const std::string nonce(kHandshakeNonceSize, '\x5a');
  std::string hs = EncodeHandshake({"job", 3, 1, nonce});
  ASSERT_EQ(hs.size(), kHandshakePrefixSize + kHandshakeNonceSize + 3);
  uint16_t len = 0;
  auto h = DecodeHandshakePrefix(hs.data(), &len);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->from_rank, 3);
  EXPECT_EQ(h->to_rank, 1);
  EXPECT_EQ(len, 3);
  ASSERT_EQ(HandshakeRestSize(len), hs.size() - kHandshakePrefixSize);
  ASSERT_TRUE(DecodeHandshakeRest(
                  absl::string_view(hs).substr(kHandshakePrefixSize), &*h)
                  .ok());
  EXPECT_EQ(h->nonce, nonce);
  EXPECT_EQ(h->job_id, "job");
  EXPECT_THAT(DecodeHandshakeRest(nonce, &*h).message(),
              HasSubstr("handshake nonce and job id of 32 bytes"));
  hs[1] = 0;
  EXPECT_THAT(DecodeHandshakePrefix(hs.data(), &len).status().message(),
              HasSubstr("bad handshake magic"));
}

// A version-2 dialer (no nonce, no proof) is told why on its 16-byte prefix,
// without the listener waiting for bytes it will never send.
TEST(HandshakeTest, OlderVersionIsRejectedOnThePrefix) {
  std::string v2 = EncodeHandshake({"job", 1, 0, ""});
  const uint16_t two = 2;
  std::memcpy(&v2[4], &two, 2);
  uint16_t len = 0;
  absl::Status s = DecodeHandshakePrefix(v2.data(), &len).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("unsupported handshake version 2 (expected 3"),
                    HasSubstr("the dialer the older one")));
}

TEST(HandshakeTest, ReplyCodesFixTheirBodySizes) {
  HandshakeReplyCode code;
  uint16_t body_len = 0;
  for (auto [c, body] :
       {std::pair{HandshakeReplyCode::kChallenge, std::string(32, 'n')},
        std::pair{HandshakeReplyCode::kAccepted, std::string(32, 'm')},
        std::pair{HandshakeReplyCode::kRejected, std::string("no such job")}}) {
    const std::string reply = EncodeHandshakeReply(c, body);
    ASSERT_TRUE(
        DecodeHandshakeReplyPrefix(reply.data(), &code, &body_len).ok());
    EXPECT_EQ(code, c);
    EXPECT_EQ(reply.substr(kHandshakeReplyPrefixSize, body_len), body);
  }
  // A rejection's reason is cut to the limit; an accept must carry a proof.
  const std::string long_reason = EncodeHandshakeReply(
      HandshakeReplyCode::kRejected, std::string(5000, 'r'));
  EXPECT_EQ(long_reason.size(),
            kHandshakeReplyPrefixSize + kMaxHandshakeReasonLength);
  const std::string short_proof =
      EncodeHandshakeReply(HandshakeReplyCode::kAccepted, "");
  EXPECT_THAT(DecodeHandshakeReplyPrefix(short_proof.data(), &code, &body_len)
                  .message(),
              HasSubstr("handshake accept carries a proof of 0 bytes, "
                        "expected 32"));
  std::string bad_code = short_proof;
  bad_code[4] = 7;
  EXPECT_THAT(
      DecodeHandshakeReplyPrefix(bad_code.data(), &code, &body_len).message(),
      HasSubstr("bad handshake reply code 7"));
}

TEST(HandshakeTest, ProofRoundTripAndBadMagic) {
  const std::string mac(kHandshakeMacSize, '\x11');
  std::string proof = EncodeHandshakeProof(mac);
  ASSERT_EQ(proof.size(), kHandshakeProofSize);
  auto got = DecodeHandshakeProof(proof.data());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, mac);
  proof[0] = 'X';
  EXPECT_THAT(DecodeHandshakeProof(proof.data()).status().message(),
              HasSubstr("bad handshake proof magic"));
}

// Encodes an abort frame's header for `status` and decodes it the way a
// reader does.
absl::StatusOr<AbortReason> AbortRoundTrip(const absl::Status& status) {
  const auto ts = AbortFrameTensors(status);
  auto h = EncodeFrameHeader(FrameKind::kAbort, "job-1", 0, 0, 0, ts);
  if (!h.ok()) return h.status();
  auto prefix = DecodeFramePrefix(h->data());
  if (!prefix.ok()) return prefix.status();
  EXPECT_EQ(prefix->kind, FrameKind::kAbort);
  auto header = DecodeFrameHeader(
      *prefix, absl::string_view(*h).substr(kFramePrefixSize));
  if (!header.ok()) return header.status();
  return DecodeAbortFrame(*header, {ts[0].second, ts[1].second});
}

TEST(FrameTest, AbortFrameCarriesCodeAndMessage) {
  EXPECT_STREQ(FrameKindName(FrameKind::kAbort), "abort");
  EXPECT_TRUE(IsKnownFrameKind(20));
  auto r = AbortRoundTrip(absl::CancelledError("cancelled by request: x"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->code, absl::StatusCode::kCancelled);
  EXPECT_EQ(r->message, "cancelled by request: x");
  r = AbortRoundTrip(absl::OkStatus());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->code, absl::StatusCode::kAborted);
  EXPECT_EQ(r->message, "aborted");
}

TEST(FrameTest, AbortMessageIsCutAtTheLimitOnACharacterBoundary) {
  // 4095 ASCII bytes then a 2-byte character straddling the limit.
  const std::string msg = std::string(4095, 'a') + "\xc3\xa9" + "tail";
  auto r = AbortRoundTrip(absl::InternalError(msg));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->code, absl::StatusCode::kInternal);
  EXPECT_EQ(r->message, std::string(4095, 'a'));
}

TEST(FrameTest, MalformedAbortFramesAreRejected) {
  auto ts = AbortFrameTensors(absl::InternalError("x"));
  FrameHeader h;
  h.tensors = {{"code", DType::kInt32, {1}}, {"message", DType::kUInt8, {1}}};
  // Unknown codes fail the call anyway.
  *static_cast<int32_t*>(ts[0].second.raw_data()) = 99;
  auto r = DecodeAbortFrame(h, {ts[0].second, ts[1].second});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->code, absl::StatusCode::kUnknown);
  h.tensors[0].name = "status";
  EXPECT_THAT(
      DecodeAbortFrame(h, {ts[0].second, ts[1].second}).status().message(),
      HasSubstr("malformed abort frame"));
  h.tensors[0].name = "code";
  h.tensors[1].shape = {kMaxAbortMessageLength + 1};
  Tensor big = Tensor::Zeros(DType::kUInt8, {kMaxAbortMessageLength + 1});
  EXPECT_EQ(DecodeAbortFrame(h, {ts[0].second, big}).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeAbortFrame(h, {ts[0].second}).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace trainyard
