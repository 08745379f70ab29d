#include "transport/frame.h"

#include <array>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/unaligned.h"

static_assert(
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
    "the frame format is little-endian; add byte swaps for this host");

namespace trainyard {
namespace {

// Reads fixed-size fields from a byte range, failing on overrun.
class Reader {
 public:
  explicit Reader(absl::string_view data) : data_(data) {}
  template <typename T>
  bool Read(T* value) {
    if (data_.size() < sizeof(T)) return false;
    *value = LoadUnaligned<T>(data_.data());
    data_.remove_prefix(sizeof(T));
    return true;
  }
  bool ReadBytes(size_t n, std::string* out) {
    if (data_.size() < n) return false;
    out->assign(data_.data(), n);
    data_.remove_prefix(n);
    return true;
  }
  size_t remaining() const { return data_.size(); }

 private:
  absl::string_view data_;
};

bool IsValidDType(uint8_t d) {
  return d <= static_cast<uint8_t>(DType::kFloat64);
}

}  // namespace

bool IsKnownFrameKind(uint16_t kind) {
  switch (static_cast<FrameKind>(kind)) {
    case FrameKind::kActivation:
    case FrameKind::kGradient:
    case FrameKind::kEvalActivation:
    case FrameKind::kSnapshot:
    case FrameKind::kAllReduceContribution:
    case FrameKind::kAllReduceResult:
    case FrameKind::kAllReduceError:
    case FrameKind::kGoodbye:
    case FrameKind::kAbort:
      return true;
  }
  return false;
}

const char* FrameKindName(FrameKind kind) {
  switch (kind) {
    case FrameKind::kActivation:
      return "activation";
    case FrameKind::kGradient:
      return "gradient";
    case FrameKind::kEvalActivation:
      return "eval-activation";
    case FrameKind::kSnapshot:
      return "snapshot";
    case FrameKind::kAllReduceContribution:
      return "all-reduce-contribution";
    case FrameKind::kAllReduceResult:
      return "all-reduce-result";
    case FrameKind::kAllReduceError:
      return "all-reduce-error";
    case FrameKind::kGoodbye:
      return "goodbye";
    case FrameKind::kAbort:
      return "abort";
  }
  return "?";
}

uint64_t TensorDesc::nbytes() const {
  return static_cast<uint64_t>(NumElements(shape)) * DTypeSize(dtype);
}

absl::StatusOr<uint64_t> AppendTensorDescs(
    absl::string_view what,
    const std::vector<std::pair<std::string, Tensor>>& tensors,
    const TensorDescLimits& limits, std::string* out) {
  if (tensors.size() > static_cast<size_t>(limits.max_tensors)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", tensors.size(), " tensors, limit ", limits.max_tensors));
  }
  uint64_t payload = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.size() > static_cast<size_t>(limits.max_name_length)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": tensor name \"", name.substr(0, 32), "...\" is ",
          name.size(), " bytes, limit ", limits.max_name_length));
    }
    if (tensor.ndim() > limits.max_ndim) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor \"", name, "\" has ", tensor.ndim(),
                       " dims, limit ", limits.max_ndim));
    }
    if (limits.cpu_only && !tensor.device().is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor \"", name, "\" is on ",
                       tensor.device().ToString(), "; only cpu is supported"));
    }
    payload += tensor.nbytes();
  }
  if (payload > limits.max_payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": payload is ",
                                                   payload, " bytes, limit ",
                                                   limits.max_payload_bytes));
  }
  for (const auto& [name, tensor] : tensors) {
    AppendLittleEndian<uint16_t>(out, static_cast<uint16_t>(name.size()));
    AppendLittleEndian<uint8_t>(out, static_cast<uint8_t>(tensor.dtype()));
    AppendLittleEndian<uint8_t>(out, static_cast<uint8_t>(tensor.ndim()));
    for (int64_t d : tensor.shape()) AppendLittleEndian<int64_t>(out, d);
    out->append(name);
  }
  return payload;
}

namespace {

// Reads descriptor `i` from `r`: its dtype, shape and name, each within
// `limits`. *elements gets its element count, saturated at `too_big`.
absl::StatusOr<TensorDesc> ReadTensorDesc(absl::string_view what, uint32_t i,
                                          const TensorDescLimits& limits,
                                          uint64_t too_big, Reader* r,
                                          uint64_t* elements) {
  uint16_t name_len;
  uint8_t dtype, ndim;
  if (!r->Read(&name_len) || !r->Read(&dtype) || !r->Read(&ndim)) {
    return absl::DataLossError(
        absl::StrCat(what, ": tensor ", i, " descriptor truncated"));
  }
  if (!IsValidDType(dtype)) {
    return absl::DataLossError(absl::StrCat(
        what, ": tensor ", i, " has unknown dtype ", static_cast<int>(dtype)));
  }
  if (ndim > limits.max_ndim) {
    return absl::DataLossError(absl::StrCat(what, ": tensor ", i, " has ",
                                            static_cast<int>(ndim),
                                            " dims, limit ", limits.max_ndim));
  }
  if (name_len > limits.max_name_length) {
    return absl::DataLossError(absl::StrCat(what, ": tensor ", i, " name is ",
                                            name_len, " bytes, limit ",
                                            limits.max_name_length));
  }
  TensorDesc d;
  d.dtype = static_cast<DType>(dtype);
  *elements = 1;
  for (int k = 0; k < ndim; ++k) {
    int64_t dim;
    if (!r->Read(&dim)) {
      return absl::DataLossError(
          absl::StrCat(what, ": tensor ", i, " shape truncated"));
    }
    if (dim < 0 || static_cast<uint64_t>(dim) > limits.max_payload_bytes) {
      return absl::DataLossError(
          absl::StrCat(what, ": tensor ", i, " has dimension ", k, " = ", dim));
    }
    d.shape.push_back(dim);
    // The product may not fit in 64 bits: saturate at too_big (a later
    // zero dimension still gives zero elements).
    if (__builtin_mul_overflow(*elements, static_cast<uint64_t>(dim),
                               elements) ||
        *elements > too_big) {
      *elements = too_big;
    }
  }
  if (!r->ReadBytes(name_len, &d.name)) {
    return absl::DataLossError(
        absl::StrCat(what, ": tensor ", i, " name truncated"));
  }
  return d;
}

}  // namespace

absl::StatusOr<std::vector<TensorDesc>> ReadTensorDescs(
    absl::string_view what, uint32_t count, uint64_t payload_size,
    const TensorDescLimits& limits, absl::string_view* data) {
  if (count > static_cast<uint32_t>(limits.max_tensors)) {
    return absl::DataLossError(absl::StrCat(
        what, ": ", count, " tensors, limit ", limits.max_tensors));
  }
  if (payload_size > limits.max_payload_bytes) {
    return absl::DataLossError(absl::StrCat(what, ": payload of ", payload_size,
                                            " bytes, limit ",
                                            limits.max_payload_bytes));
  }
  // A tensor bigger than the limit only matters as "too big": element
  // counts saturate at too_big <= 2^60 + 1, so with dtype sizes <= 8 and
  // total <= payload_size <= 2^60 nothing below overflows.
  const uint64_t too_big = limits.max_payload_bytes + 1;
  std::vector<TensorDesc> descs;
  descs.reserve(count);
  Reader r(*data);
  uint64_t total = 0;
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t elements = 0;
    absl::StatusOr<TensorDesc> d =
        ReadTensorDesc(what, i, limits, too_big, &r, &elements);
    if (!d.ok()) return d.status();
    total += elements * DTypeSize(d->dtype);
    if (total > payload_size) {
      return absl::DataLossError(absl::StrCat(
          what, ": tensor \"", d->name, "\" ", ShapeToString(d->shape),
          " overruns the payload of ", payload_size, " bytes"));
    }
    descs.push_back(*std::move(d));
  }
  if (total != payload_size) {
    return absl::DataLossError(absl::StrCat(what, ": tensors hold ", total,
                                            " bytes, payload size says ",
                                            payload_size));
  }
  data->remove_prefix(data->size() - r.remaining());
  return descs;
}

absl::StatusOr<std::string> EncodeFrameHeader(
    FrameKind kind, absl::string_view job_id, int64_t step, int32_t microbatch,
    int32_t chunk, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  if (chunk < 0 || chunk > kMaxFrameChunk) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame: chunk must be in [0, ", kMaxFrameChunk, "], got ", chunk));
  }
  if (job_id.size() > static_cast<size_t>(kMaxJobIdLength)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame: job id is ", job_id.size(), " bytes, limit ", kMaxJobIdLength));
  }
  std::string descs;
  descs.reserve(tensors.size() * 96);
  absl::StatusOr<uint64_t> payload =
      AppendTensorDescs("frame", tensors, TensorDescLimits(), &descs);
  if (!payload.ok()) return payload.status();
  std::string out;
  out.reserve(kFramePrefixSize + job_id.size() + descs.size());
  AppendLittleEndian<uint32_t>(&out, kFrameMagic);
  AppendLittleEndian<uint16_t>(&out, kFrameVersion);
  AppendLittleEndian<uint16_t>(&out, static_cast<uint16_t>(kind));
  AppendLittleEndian<uint32_t>(&out, 0);  // header_size, patched below
  AppendLittleEndian<uint32_t>(&out, static_cast<uint32_t>(tensors.size()));
  AppendLittleEndian<int64_t>(&out, step);
  AppendLittleEndian<int32_t>(&out, microbatch);
  AppendLittleEndian<uint16_t>(&out, static_cast<uint16_t>(job_id.size()));
  AppendLittleEndian<uint16_t>(&out, static_cast<uint16_t>(chunk));
  AppendLittleEndian<uint64_t>(&out, *payload);
  out.append(job_id.data(), job_id.size());
  out.append(descs);
  const uint32_t header_size = static_cast<uint32_t>(out.size());
  std::memcpy(&out[8], &header_size, 4);
  return out;
}

absl::StatusOr<FramePrefix> DecodeFramePrefix(const char* data) {
  const uint32_t magic = LoadUnaligned<uint32_t>(data);
  if (magic != kFrameMagic) {
    return absl::DataLossError(absl::StrFormat(
        "bad frame magic 0x%08x (expected 0x%08x)", magic, kFrameMagic));
  }
  const uint16_t version = LoadUnaligned<uint16_t>(data + 4);
  if (version != kFrameVersion) {
    // The handshake has its own version, so a peer of another release can
    // get this far.
    return absl::DataLossError(absl::StrCat(
        "unsupported frame version ", version, " (expected ", kFrameVersion,
        version < kFrameVersion
            ? "; the sender runs an older Trainyard release)"
            : "; the sender runs a newer Trainyard release)"));
  }
  FramePrefix p;
  const uint16_t kind = LoadUnaligned<uint16_t>(data + 6);
  if (!IsKnownFrameKind(kind)) {
    return absl::DataLossError(absl::StrCat("unknown frame kind ", kind));
  }
  p.kind = static_cast<FrameKind>(kind);
  p.header_size = LoadUnaligned<uint32_t>(data + 8);
  p.num_tensors = LoadUnaligned<uint32_t>(data + 12);
  p.step = LoadUnaligned<int64_t>(data + 16);
  p.microbatch = LoadUnaligned<int32_t>(data + 24);
  p.job_id_length = LoadUnaligned<uint16_t>(data + 28);
  p.chunk = LoadUnaligned<uint16_t>(data + 30);
  p.payload_size = LoadUnaligned<uint64_t>(data + 32);
  if (p.num_tensors > static_cast<uint32_t>(kMaxFrameTensors)) {
    return absl::DataLossError(absl::StrCat(
        "frame claims ", p.num_tensors, " tensors, limit ", kMaxFrameTensors));
  }
  if (p.job_id_length > kMaxJobIdLength) {
    return absl::DataLossError(absl::StrCat("frame claims a job id of ",
                                            p.job_id_length, " bytes, limit ",
                                            kMaxJobIdLength));
  }
  if (p.header_size < kFramePrefixSize + p.job_id_length ||
      p.header_size > kMaxFrameHeaderSize) {
    return absl::DataLossError(absl::StrCat(
        "frame claims a header of ", p.header_size, " bytes, must be in [",
        kFramePrefixSize + p.job_id_length, ", ", kMaxFrameHeaderSize, "]"));
  }
  if (p.payload_size > kMaxFramePayloadBytes) {
    return absl::DataLossError(absl::StrCat("frame claims a payload of ",
                                            p.payload_size, " bytes, limit ",
                                            kMaxFramePayloadBytes));
  }
  return p;
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(const FramePrefix& prefix,
                                              absl::string_view rest) {
  if (rest.size() != prefix.header_size - kFramePrefixSize) {
    return absl::DataLossError(
        absl::StrCat("frame header: got ", rest.size() + kFramePrefixSize,
                     " bytes, prefix says ", prefix.header_size));
  }
  FrameHeader h;
  h.prefix = prefix;
  if (rest.size() < prefix.job_id_length) {  // DecodeFramePrefix checks this
    return absl::DataLossError(absl::StrCat("frame header: ", rest.size(),
                                            " bytes cannot hold a job id of ",
                                            prefix.job_id_length));
  }
  h.job_id.assign(rest.data(), prefix.job_id_length);
  rest.remove_prefix(prefix.job_id_length);
  absl::StatusOr<std::vector<TensorDesc>> tensors =
      ReadTensorDescs("frame header", prefix.num_tensors, prefix.payload_size,
                      TensorDescLimits(), &rest);
  if (!tensors.ok()) return tensors.status();
  h.tensors = std::move(*tensors);
  if (!rest.empty()) {
    return absl::DataLossError(
        absl::StrCat("frame header: ", rest.size(), " trailing bytes"));
  }
  return h;
}

std::vector<std::pair<std::string, Tensor>> AbortFrameTensors(
    const absl::Status& status) {
  const absl::StatusCode code =
      status.ok() ? absl::StatusCode::kAborted : status.code();
  absl::string_view message = status.ok() ? "aborted" : status.message();
  if (message.size() > static_cast<size_t>(kMaxAbortMessageLength)) {
    size_t n = kMaxAbortMessageLength;
    // Back off continuation bytes (10xxxxxx) so a character is not split.
    while (n > 0 && (static_cast<unsigned char>(message[n]) & 0xC0) == 0x80) {
      --n;
    }
    message = message.substr(0, n);
  }
  Tensor c = Tensor::Empty(DType::kInt32, {1});
  *static_cast<int32_t*>(c.raw_data()) = static_cast<int32_t>(code);
  Tensor m =
      Tensor::Empty(DType::kUInt8, {static_cast<int64_t>(message.size())});
  if (!message.empty())
    std::memcpy(m.raw_data(), message.data(), message.size());
  return {{"code", std::move(c)}, {"message", std::move(m)}};
}

absl::StatusOr<AbortReason> DecodeAbortFrame(
    const FrameHeader& header, const std::vector<Tensor>& tensors) {
  const std::vector<TensorDesc>& d = header.tensors;
  if (d.size() != 2 || tensors.size() != 2 || d[0].name != "code" ||
      d[0].dtype != DType::kInt32 || d[0].shape != Shape{1} ||
      d[1].name != "message" || d[1].dtype != DType::kUInt8 ||
      d[1].shape.size() != 1) {
    return absl::DataLossError(
        "malformed abort frame: expected tensors \"code\" int32 [1] and "
        "\"message\" uint8 [n]");
  }
  if (d[1].shape[0] > kMaxAbortMessageLength) {
    return absl::DataLossError(absl::StrCat("abort frame message of ",
                                            d[1].shape[0], " bytes, limit ",
                                            kMaxAbortMessageLength));
  }
  AbortReason r;
  const int32_t code =
      LoadUnaligned<int32_t>(static_cast<const char*>(tensors[0].raw_data()));
  r.code = code >= 1 && code <= 16 ? static_cast<absl::StatusCode>(code)
                                   : absl::StatusCode::kUnknown;
  r.message.assign(static_cast<const char*>(tensors[1].raw_data()),
                   tensors[1].nbytes());
  return r;
}

namespace {

// "\"x\" float32 [2, 3], ..." or "no tensors".
std::string DescribeTensors(const std::vector<TensorDesc>& d) {
  if (d.empty()) return std::string("no tensors");
  std::vector<std::string> parts;
  for (const TensorDesc& t : d) {
    parts.push_back(absl::StrCat("\"", t.name, "\" ", DTypeName(t.dtype), " ",
                                 ShapeToString(t.shape)));
  }
  return absl::StrJoin(parts, ", ");
}

// Exactly one 1-d tensor `name` of `dtype`, at most `max_len` long; `what`
// starts the error ("malformed all-reduce-result frame").
absl::Status ExpectOneVector(const std::string& what,
                             const std::vector<TensorDesc>& d,
                             size_t num_tensors, const char* name, DType dtype,
                             int64_t max_len) {
  if (d.size() != 1 || num_tensors != 1 || d[0].name != name ||
      d[0].dtype != dtype || d[0].shape.size() != 1) {
    return absl::DataLossError(absl::StrCat(what, ": expected one tensor \"",
                                            name, "\" ", DTypeName(dtype),
                                            " [n], got ", DescribeTensors(d)));
  }
  if (d[0].shape[0] > max_len) {
    return absl::DataLossError(absl::StrCat(what, ": \"", name, "\" has ",
                                            d[0].shape[0], " elements, limit ",
                                            max_len));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckFrameContent(const FrameHeader& header,
                               const std::vector<Tensor>& tensors, int to_rank,
                               int from_rank) {
  const FrameKind kind = header.prefix.kind;
  const std::vector<TensorDesc>& d = header.tensors;
  const std::string what =
      absl::StrCat("malformed ", FrameKindName(kind), " frame");
  switch (kind) {
    case FrameKind::kActivation:
    case FrameKind::kGradient:
    case FrameKind::kEvalActivation:
    case FrameKind::kSnapshot:
      return absl::OkStatus();  // the message's own tensors
    case FrameKind::kAllReduceContribution:
      if (to_rank != 0) {
        return absl::DataLossError(
            absl::StrCat(what, " sent to rank ", to_rank,
                         ": only rank 0 gathers contributions"));
      }
      return ExpectOneVector(what, d, tensors.size(), "values", DType::kFloat64,
                             INT64_MAX);
    case FrameKind::kAllReduceResult:
    case FrameKind::kAllReduceError:
      if (from_rank != 0) {
        return absl::DataLossError(absl::StrCat(what, " from rank ", from_rank,
                                                ": only rank 0 sends one"));
      }
      return kind == FrameKind::kAllReduceResult
                 ? ExpectOneVector(what, d, tensors.size(), "values",
                                   DType::kFloat64, INT64_MAX)
                 : ExpectOneVector(what, d, tensors.size(), "message",
                                   DType::kUInt8, kMaxAbortMessageLength);
    case FrameKind::kGoodbye:
      if (!d.empty()) {
        return absl::DataLossError(absl::StrCat(
            what, ": expected no tensors, got ", DescribeTensors(d)));
      }
      return absl::OkStatus();
    case FrameKind::kAbort:
      return absl::OkStatus();  // DecodeAbortFrame checks it
  }
  return absl::DataLossError(
      absl::StrCat("unknown frame kind ", static_cast<int>(kind)));
}

std::string EncodeHandshake(const Handshake& handshake) {
  std::string out;
  AppendLittleEndian<uint32_t>(&out, kHandshakeMagic);
  AppendLittleEndian<uint16_t>(&out, kHandshakeVersion);
  AppendLittleEndian<uint16_t>(&out,
                               static_cast<uint16_t>(handshake.job_id.size()));
  AppendLittleEndian<int32_t>(&out, handshake.from_rank);
  AppendLittleEndian<int32_t>(&out, handshake.to_rank);
  std::string nonce = handshake.nonce;
  nonce.resize(kHandshakeNonceSize, '\0');
  out.append(nonce);
  out.append(handshake.job_id);
  return out;
}

absl::StatusOr<Handshake> DecodeHandshakePrefix(const char* data,
                                                uint16_t* job_id_length) {
  const uint32_t magic = LoadUnaligned<uint32_t>(data);
  if (magic != kHandshakeMagic) {
    return absl::DataLossError(
        absl::StrFormat("bad handshake magic 0x%08x (expected 0x%08x)", magic,
                        kHandshakeMagic));
  }
  const uint16_t version = LoadUnaligned<uint16_t>(data + 4);
  if (version != kHandshakeVersion) {
    return absl::DataLossError(absl::StrCat(
        "unsupported handshake version ", version, " (expected ",
        kHandshakeVersion, "; the two workers run different Trainyard ",
        version < kHandshakeVersion ? "releases, the dialer the older one)"
                                    : "releases, the dialer the newer one)"));
  }
  *job_id_length = LoadUnaligned<uint16_t>(data + 6);
  if (*job_id_length == 0 || *job_id_length > kMaxJobIdLength) {
    return absl::DataLossError(absl::StrCat("handshake job id length ",
                                            *job_id_length, " not in [1, ",
                                            kMaxJobIdLength, "]"));
  }
  Handshake h;
  h.from_rank = LoadUnaligned<int32_t>(data + 8);
  h.to_rank = LoadUnaligned<int32_t>(data + 12);
  return h;
}

absl::Status DecodeHandshakeRest(absl::string_view rest, Handshake* handshake) {
  if (rest.size() <= kHandshakeNonceSize ||
      rest.size() > HandshakeRestSize(kMaxJobIdLength)) {
    return absl::DataLossError(absl::StrCat(
        "handshake nonce and job id of ", rest.size(), " bytes, expected ",
        kHandshakeNonceSize, " + [1, ", kMaxJobIdLength, "]"));
  }
  handshake->nonce.assign(rest.data(), kHandshakeNonceSize);
  handshake->job_id.assign(rest.data() + kHandshakeNonceSize,
                           rest.size() - kHandshakeNonceSize);
  return absl::OkStatus();
}

std::string EncodeHandshakeReply(HandshakeReplyCode code,
                                 absl::string_view body) {
  if (code == HandshakeReplyCode::kRejected) {
    body = body.substr(0, kMaxHandshakeReasonLength);
  }
  std::string out;
  AppendLittleEndian<uint32_t>(&out, kHandshakeReplyMagic);
  AppendLittleEndian<uint32_t>(&out, static_cast<uint32_t>(code));
  AppendLittleEndian<uint16_t>(&out, static_cast<uint16_t>(body.size()));
  AppendLittleEndian<uint16_t>(&out, 0);
  out.append(body.data(), body.size());
  return out;
}

absl::Status DecodeHandshakeReplyPrefix(const char* data,
                                        HandshakeReplyCode* code,
                                        uint16_t* body_length) {
  const uint32_t magic = LoadUnaligned<uint32_t>(data);
  if (magic != kHandshakeReplyMagic) {
    return absl::DataLossError(
        absl::StrFormat("bad handshake reply magic 0x%08x (expected 0x%08x)",
                        magic, kHandshakeReplyMagic));
  }
  const uint32_t raw_code = LoadUnaligned<uint32_t>(data + 4);
  *body_length = LoadUnaligned<uint16_t>(data + 8);
  switch (raw_code) {
    case static_cast<uint32_t>(HandshakeReplyCode::kRejected):
      if (*body_length > kMaxHandshakeReasonLength) {
        return absl::DataLossError(absl::StrCat("handshake reply reason of ",
                                                *body_length, " bytes, limit ",
                                                kMaxHandshakeReasonLength));
      }
      break;
    case static_cast<uint32_t>(HandshakeReplyCode::kAccepted):
      if (*body_length != kHandshakeMacSize) {
        return absl::DataLossError(
            absl::StrCat("handshake accept carries a proof of ", *body_length,
                         " bytes, expected ", kHandshakeMacSize));
      }
      break;
    case static_cast<uint32_t>(HandshakeReplyCode::kChallenge):
      if (*body_length != kHandshakeNonceSize) {
        return absl::DataLossError(absl::StrCat(
            "handshake challenge carries a nonce of ", *body_length,
            " bytes, expected ", kHandshakeNonceSize));
      }
      break;
    default:
      return absl::DataLossError(
          absl::StrCat("bad handshake reply code ", raw_code));
  }
  *code = static_cast<HandshakeReplyCode>(raw_code);
  return absl::OkStatus();
}

std::string EncodeHandshakeProof(absl::string_view mac) {
  std::string out;
  AppendLittleEndian<uint32_t>(&out, kHandshakeProofMagic);
  std::string tag(mac);
  tag.resize(kHandshakeMacSize, '\0');
  out.append(tag);
  return out;
}

absl::StatusOr<std::string> DecodeHandshakeProof(const char* data) {
  const uint32_t magic = LoadUnaligned<uint32_t>(data);
  if (magic != kHandshakeProofMagic) {
    return absl::DataLossError(
        absl::StrFormat("bad handshake proof magic 0x%08x (expected 0x%08x)",
                        magic, kHandshakeProofMagic));
  }
  return std::string(data + 4, kHandshakeMacSize);
}

}  // namespace trainyard
