// The NCCL transport's message header (transport/nccl_transport.h): the
// fixed-size block sent before every message's payloads, saying the
// message's kind, step, microbatch and chunk and describing its tensors in
// the TCP frame's descriptor layout (transport/frame.h's codec).
//
// Thread safety: pure functions.
#ifndef TRAINYARD_TRANSPORT_NCCL_HEADER_H_
#define TRAINYARD_TRANSPORT_NCCL_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/frame.h"
#include "transport/transport.h"

namespace trainyard {

// The fixed size of the header sent before every message's payloads, and
// its limits; EncodeNcclHeader rejects a message beyond them.
inline constexpr size_t kNcclHeaderBytes = 8192;
inline constexpr int kNcclMaxTensors = 32;
inline constexpr int kNcclMaxNameLength = 128;
inline constexpr int kNcclMaxNdim = 8;
// Far beyond any one GPU's memory; bounds the sizes a header may claim.
inline constexpr uint64_t kNcclMaxPayloadBytes = uint64_t{1} << 40;

struct NcclHeader {
  MessageKind kind = MessageKind::kActivation;
  int64_t step = 0;
  int32_t microbatch = 0;
  uint16_t chunk = 0;               // the receiving stage's model chunk
  std::vector<TensorDesc> tensors;  // transport/frame.h's descriptor
  uint64_t payload_bytes = 0;       // sum of the tensors' sizes
};

// Exactly kNcclHeaderBytes bytes (little-endian, zero-padded): u32 magic
// "TYNC", u16 version 3, u16 kind, i64 step, i32 microbatch, u16 tensor
// count, u16 chunk, u64 payload bytes (32 bytes); then the tensor
// descriptors of transport/frame.h (AppendTensorDescs: per tensor u16 name
// length, u8 dtype, u8 ndim, i64 dims[ndim], the name); docs/GPU.md and
// docs/TRANSPORT_FRAME.md ("Compatibility") say how other versions differ.
// InvalidArgument naming the tensor when a limit above
// is exceeded, or naming the value when Message::chunk is outside [0,
// kMaxFrameChunk]; tensors may be on any device.
absl::StatusOr<std::string> EncodeNcclHeader(const Message& message);
// Decodes and checks a header (DataLoss naming the bad field otherwise:
// magic, version, kind, or a descriptor, as transport/frame.h's
// ReadTensorDescs).
absl::StatusOr<NcclHeader> DecodeNcclHeader(absl::string_view bytes);

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_NCCL_HEADER_H_
