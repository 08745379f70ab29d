#include "transport/nccl_header.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainyard {
namespace {

constexpr uint32_t kNcclHeaderMagic = 0x434E5954;  // "TYNC" little-endian
// The header layout's version: the u16 at offset 22 is the message's model
// chunk.
constexpr uint16_t kNcclHeaderVersion = 3;
constexpr size_t kNcclHeaderPrefix = 32;

TensorDescLimits NcclDescLimits() {
  TensorDescLimits l;
  l.max_tensors = kNcclMaxTensors;
  l.max_name_length = kNcclMaxNameLength;
  l.max_ndim = kNcclMaxNdim;
  l.max_payload_bytes = kNcclMaxPayloadBytes;
  l.cpu_only = false;  // device tensors are sent in place
  return l;
}

// The limits keep the descriptors (frame layout: 4 bytes, 8 per dim, the
// name) inside the fixed header.
static_assert(kNcclHeaderPrefix + kNcclMaxTensors * (4 + 8 * kNcclMaxNdim +
                                                     kNcclMaxNameLength) <=
                  kNcclHeaderBytes,
              "header limits exceed kNcclHeaderBytes");

template <typename T>
void PutLe(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // every supported host is little-endian
  out->append(b, sizeof(T));
}

template <typename T>
T GetLe(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

constexpr absl::string_view kWhat = "nccl message header";

absl::Status HeaderError(absl::string_view what) {
  return absl::DataLossError(absl::StrCat(kWhat, ": ", what));
}

}  // namespace

absl::StatusOr<std::string> EncodeNcclHeader(const Message& message) {
  if (message.chunk < 0 || message.chunk > kMaxFrameChunk) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": chunk must be in [0, ", kMaxFrameChunk,
                     "], got ", message.chunk));
  }
  std::string descs;
  absl::StatusOr<uint64_t> payload =
      AppendTensorDescs(kWhat, message.tensors, NcclDescLimits(), &descs);
  if (!payload.ok()) return payload.status();
  std::string out;
  out.reserve(kNcclHeaderBytes);
  PutLe<uint32_t>(&out, kNcclHeaderMagic);
  PutLe<uint16_t>(&out, kNcclHeaderVersion);
  PutLe<uint16_t>(&out, static_cast<uint16_t>(message.kind));
  PutLe<int64_t>(&out, message.step);
  PutLe<int32_t>(&out, message.microbatch);
  PutLe<uint16_t>(&out, static_cast<uint16_t>(message.tensors.size()));
  PutLe<uint16_t>(&out, static_cast<uint16_t>(message.chunk));
  PutLe<uint64_t>(&out, *payload);
  out.append(descs);
  out.resize(kNcclHeaderBytes, '\0');
  return out;
}

absl::StatusOr<NcclHeader> DecodeNcclHeader(absl::string_view bytes) {
  if (bytes.size() != kNcclHeaderBytes) {
    return HeaderError(absl::StrCat("is ", bytes.size(), " bytes, expected ",
                                    kNcclHeaderBytes));
  }
  const char* p = bytes.data();
  const uint32_t magic = GetLe<uint32_t>(p);
  if (magic != kNcclHeaderMagic) {
    return HeaderError(absl::StrCat("bad magic 0x", absl::Hex(magic)));
  }
  const uint16_t version = GetLe<uint16_t>(p + 4);
  if (version != kNcclHeaderVersion) {
    return HeaderError(absl::StrCat("unsupported version ", version,
                                    " (expected ", kNcclHeaderVersion, ")"));
  }
  const uint16_t kind = GetLe<uint16_t>(p + 6);
  if (kind > static_cast<uint16_t>(MessageKind::kSnapshot)) {
    return HeaderError(absl::StrCat("unknown message kind ", kind));
  }
  NcclHeader h;
  h.kind = static_cast<MessageKind>(kind);
  h.step = GetLe<int64_t>(p + 8);
  h.microbatch = GetLe<int32_t>(p + 16);
  const uint16_t count = GetLe<uint16_t>(p + 20);
  h.chunk = GetLe<uint16_t>(p + 22);
  h.payload_bytes = GetLe<uint64_t>(p + 24);
  absl::string_view rest = bytes.substr(kNcclHeaderPrefix);
  absl::StatusOr<std::vector<TensorDesc>> tensors =
      ReadTensorDescs(kWhat, count, h.payload_bytes, NcclDescLimits(), &rest);
  if (!tensors.ok()) return tensors.status();
  h.tensors = std::move(*tensors);
  return h;
}

}  // namespace trainyard
