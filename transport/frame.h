// Transport frame codec: the byte layout of the messages the TCP transport
// sends between pipeline stages, and of the connection handshake. The layout is
// specified in docs/TRANSPORT_FRAME.md; this file is its only encoder and
// decoder.
//
// A frame is a header (fixed 40-byte prefix, job id, tensor descriptors),
// the tensors' bytes back to back, and a CRC32C over header and payload.
// Decoding is split so that a reader can check every size a frame claims
// against the limits below before allocating anything: DecodeFramePrefix
// on the fixed prefix, then DecodeFrameHeader on the rest of the header.
//
// All functions are pure and thread-safe.
#ifndef TRAINYARD_TRANSPORT_FRAME_H_
#define TRAINYARD_TRANSPORT_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace trainyard {

// "TYFR", "TYHS", "TYHA" and "TYHP" as little-endian u32.
inline constexpr uint32_t kFrameMagic = 0x52465954;
inline constexpr uint32_t kHandshakeMagic = 0x53485954;
inline constexpr uint32_t kHandshakeReplyMagic = 0x41485954;
inline constexpr uint32_t kHandshakeProofMagic = 0x50485954;
// The frame layout's version: all-reduce values are float64 tensors and the
// u16 at offset 30 is the message's model chunk (docs/TRANSPORT_FRAME.md,
// "Compatibility", says how other versions differ).
inline constexpr uint16_t kFrameVersion = 3;
// The hello's version: both ends prove they hold the job secret
// (challenge-response) before any frame.
inline constexpr uint16_t kHandshakeVersion = 3;

inline constexpr size_t kFramePrefixSize = 40;
inline constexpr size_t kFrameTrailerSize = 4;  // CRC32C
inline constexpr size_t kHandshakePrefixSize = 16;
inline constexpr size_t kHandshakeReplyPrefixSize = 12;
inline constexpr size_t kHandshakeNonceSize = 32;
inline constexpr size_t kHandshakeMacSize = 32;  // HMAC-SHA256
inline constexpr size_t kHandshakeProofSize = 4 + kHandshakeMacSize;

// Appends `value`'s bytes in the wire's (little-endian) order.
template <typename T>
void AppendLittleEndian(std::string* out, T value) {
  char buf[sizeof(T)];
  std::memcpy(buf, &value, sizeof(T));
  out->append(buf, sizeof(T));
}

// Limits; a frame or handshake that claims more is rejected before any
// allocation.
inline constexpr int kMaxFrameTensors = 64;
inline constexpr int kMaxTensorNameLength = 256;
inline constexpr int kMaxTensorNdim = 8;
inline constexpr int kMaxJobIdLength = 256;
inline constexpr int kMaxHandshakeReasonLength = 1024;
inline constexpr int kMaxAbortMessageLength = 4096;
inline constexpr uint64_t kMaxFramePayloadBytes = uint64_t{2} << 30;  // 2 GiB
// Message::chunk travels as a u16 (in the frame and the NCCL header).
inline constexpr int32_t kMaxFrameChunk = 65535;
// Largest possible header: prefix, job id, and kMaxFrameTensors descriptors
// of kMaxTensorNdim dims with kMaxTensorNameLength-byte names.
inline constexpr size_t kMaxFrameHeaderSize =
    kFramePrefixSize + kMaxJobIdLength +
    kMaxFrameTensors * (4 + 8 * kMaxTensorNdim + kMaxTensorNameLength);

// The kind field. 0..3 are MessageKind (transport/transport.h); 16 and up
// are internal to the transport: the all-reduce's messages
// (transport/collectives.h), the goodbye and the abort.
enum class FrameKind : uint16_t {
  kActivation = 0,
  kGradient = 1,
  kEvalActivation = 2,
  kSnapshot = 3,  // a stage's state between steps (MessageKind::kSnapshot)
  kAllReduceContribution = 16,  // rank r -> rank 0: one float64 tensor "values"
  kAllReduceResult = 17,        // rank 0 -> rank r: one float64 tensor "values"
  kAllReduceError = 18,         // rank 0 -> rank r: uint8 tensor "message"
  kGoodbye = 19,                // orderly close, no tensors
  kAbort = 20,  // the sender aborted: "code" int32 [1], "message" uint8 [n]
};
bool IsKnownFrameKind(uint16_t kind);
const char* FrameKindName(FrameKind kind);

struct TensorDesc {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  uint64_t nbytes() const;
};

// Tensor descriptors: the part of a frame header after the job id, also
// the descriptor block of the NCCL transport's message header
// (transport/nccl_transport.h). Per tensor: u16 name length, u8 dtype, u8 ndim,
// i64 dims[ndim], then the name's bytes (docs/TRANSPORT_FRAME.md). The
// limits are the caller's; the defaults are the frame's.
struct TensorDescLimits {
  int max_tensors = kMaxFrameTensors;
  int max_name_length = kMaxTensorNameLength;
  int max_ndim = kMaxTensorNdim;
  uint64_t max_payload_bytes = kMaxFramePayloadBytes;  // < 2^60
  bool cpu_only = true;  // reject tensors that are not on the CPU
};

// Appends the descriptors of `tensors` to *out and returns the payload size
// (the sum of the tensors' nbytes()). InvalidArgument "<what>: ..." naming
// the tensor and the limit when the count, a name, a rank, a device
// (cpu_only) or the payload is beyond `limits`; *out is unchanged then.
absl::StatusOr<uint64_t> AppendTensorDescs(
    absl::string_view what,
    const std::vector<std::pair<std::string, Tensor>>& tensors,
    const TensorDescLimits& limits, std::string* out);

// Reads `count` descriptors from the front of *data and advances it past
// them. DataLoss "<what>: ..." for more than limits.max_tensors (checked
// before reading), a truncated descriptor, an unknown dtype, a rank, name
// length or dimension beyond `limits`, or tensors whose bytes overrun or do
// not add up to `payload_size`.
absl::StatusOr<std::vector<TensorDesc>> ReadTensorDescs(
    absl::string_view what, uint32_t count, uint64_t payload_size,
    const TensorDescLimits& limits, absl::string_view* data);

// The fixed prefix, validated: magic, version, kind and every size within
// the limits.
struct FramePrefix {
  FrameKind kind = FrameKind::kActivation;
  uint32_t header_size = 0;  // whole header, prefix included
  uint32_t num_tensors = 0;
  int64_t step = 0;
  int32_t microbatch = 0;
  uint16_t chunk = 0;  // the receiving stage's model chunk (Message::chunk)
  uint16_t job_id_length = 0;
  uint64_t payload_size = 0;
};

struct FrameHeader {
  FramePrefix prefix;
  std::string job_id;
  std::vector<TensorDesc> tensors;
};

// Encodes the header of a frame carrying `tensors` (CPU tensors only).
// Fails with InvalidArgument naming the tensor and limit when a count,
// name, rank or size exceeds the limits, or naming the value when `chunk`
// is outside [0, kMaxFrameChunk]. Internal kinds send chunk 0.
absl::StatusOr<std::string> EncodeFrameHeader(
    FrameKind kind, absl::string_view job_id, int64_t step, int32_t microbatch,
    int32_t chunk, const std::vector<std::pair<std::string, Tensor>>& tensors);

// `data` holds kFramePrefixSize bytes. Errors (DataLoss) say which field is
// wrong and its value.
absl::StatusOr<FramePrefix> DecodeFramePrefix(const char* data);

// `rest` holds the header after the prefix (prefix.header_size -
// kFramePrefixSize bytes). Checks every descriptor and that the tensors'
// sizes add up to prefix.payload_size.
absl::StatusOr<FrameHeader> DecodeFrameHeader(const FramePrefix& prefix,
                                              absl::string_view rest);

// An abort frame's content: the status the sending rank aborted with.
struct AbortReason {
  absl::StatusCode code = absl::StatusCode::kAborted;
  std::string message;
};
// The tensors of an abort frame for `status`: "code", int32 [1], the
// absl::StatusCode (kAborted for an OK status), and "message", uint8 [n], its
// message cut to at most kMaxAbortMessageLength bytes (never inside a UTF-8
// sequence).
std::vector<std::pair<std::string, Tensor>> AbortFrameTensors(
    const absl::Status& status);
// Reads an abort frame's tensors back (`header.tensors[i]` describes
// `tensors[i]`). A code outside 1..16 becomes kUnknown, so that a newer
// sender's codes still fail the call. DataLoss when the tensors are not
// the two above or the message exceeds kMaxAbortMessageLength.
absl::StatusOr<AbortReason> DecodeAbortFrame(
    const FrameHeader& header, const std::vector<Tensor>& tensors);

// Checks that a frame `from_rank` sent to `to_rank` carries the tensors its
// kind promises (`header.tensors[i]` describes `tensors[i]`;
// docs/TRANSPORT_FRAME.md), so that nothing downstream has to: the decoder
// has checked sizes and dtypes, not what each kind means. All-reduce
// contributions go only to rank 0, results and errors come only from it.
// DataLoss "malformed <kind> frame: ..." saying what is wrong; the caller
// names the peer.
absl::Status CheckFrameContent(const FrameHeader& header,
                               const std::vector<Tensor>& tensors, int to_rank,
                               int from_rank);

// Connection handshake, version kHandshakeVersion (docs/TRANSPORT_FRAME.md
// "Connection setup"): the dialer's hello, the listener's challenge, the
// dialer's proof, the listener's accept carrying its own proof; the listener
// may answer a rejection with a reason instead at any step. The proofs
// themselves (HMAC inputs) are transport/tcp_handshake.h.

// The dialer's hello: the first bytes on a connection.
struct Handshake {
  std::string job_id;
  int32_t from_rank = 0;
  int32_t to_rank = 0;
  // The dialer's fresh random nonce, kHandshakeNonceSize bytes (the encoder
  // zero-pads or cuts anything else).
  std::string nonce;
};
// The fixed prefix, the nonce, then the job id.
std::string EncodeHandshake(const Handshake& handshake);
// `data` holds kHandshakePrefixSize bytes; returns the handshake without
// its nonce and job id, and the job id's length in *job_id_length (1 ..
// kMaxJobIdLength). DataLoss for a bad magic, another version (an older or
// newer peer: the message says which versions) or a bad length; all three
// are checked on these 16 bytes, before waiting for more.
absl::StatusOr<Handshake> DecodeHandshakePrefix(const char* data,
                                                uint16_t* job_id_length);
// Bytes after the prefix: the nonce and the job id.
inline size_t HandshakeRestSize(uint16_t job_id_length) {
  return kHandshakeNonceSize + job_id_length;
}
// Fills handshake->nonce and ->job_id from the HandshakeRestSize() bytes
// after the prefix. DataLoss when `rest` has another size.
absl::Status DecodeHandshakeRest(absl::string_view rest, Handshake* handshake);

// The listener's messages: a code and a body whose meaning and size the
// code fixes.
enum class HandshakeReplyCode : uint32_t {
  kAccepted = 0,   // body: the listener's proof, kHandshakeMacSize bytes
  kRejected = 1,   // body: the reason, UTF-8, <= kMaxHandshakeReasonLength
  kChallenge = 2,  // body: the listener's nonce, kHandshakeNonceSize bytes
};
// A rejection's reason is cut to kMaxHandshakeReasonLength bytes.
std::string EncodeHandshakeReply(HandshakeReplyCode code,
                                 absl::string_view body);
// `data` holds kHandshakeReplyPrefixSize bytes. DataLoss for a bad magic, an
// unknown code, or a body length that code does not allow.
absl::Status DecodeHandshakeReplyPrefix(const char* data,
                                        HandshakeReplyCode* code,
                                        uint16_t* body_length);

// The dialer's proof: magic and kHandshakeMacSize bytes of HMAC
// (kHandshakeProofSize bytes in all).
std::string EncodeHandshakeProof(absl::string_view mac);
// `data` holds kHandshakeProofSize bytes; returns the MAC. DataLoss for a
// bad magic.
absl::StatusOr<std::string> DecodeHandshakeProof(const char* data);

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_FRAME_H_
