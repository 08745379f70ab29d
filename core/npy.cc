#include "core/npy.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/file_util.h"
#include "core/status_macros.h"

namespace trainyard {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

absl::Status Bad(const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
}

// A parser for the Python dict literal in the header, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// Only what numpy writes: str keys; str, True/False and int-tuple values.
class HeaderDictParser {
 public:
  explicit HeaderDictParser(absl::string_view text) : s_(text) {}

  struct Result {
    bool has_descr = false, has_fortran = false, has_shape = false;
    std::string descr;
    bool fortran_order = false;
    Shape shape;
  };

  // Returns a reason on failure (the caller adds the path).
  absl::StatusOr<Result> Parse() {
    Result r;
    SkipSpace();
    if (!Eat('{')) return Err("expected '{'");
    for (;;) {
      SkipSpace();
      if (Eat('}')) break;
      std::string key;
      if (!ParseString(&key)) return Err("expected a quoted key");
      SkipSpace();
      if (!Eat(':')) return Err(absl::StrCat("expected ':' after '", key, "'"));
      SkipSpace();
      if (key == "descr") {
        if (!ParseString(&r.descr)) return Err("'descr' must be a string");
        r.has_descr = true;
      } else if (key == "fortran_order") {
        if (Consume("True")) {
          r.fortran_order = true;
        } else if (Consume("False")) {
          r.fortran_order = false;
        } else {
          return Err("'fortran_order' must be True or False");
        }
        r.has_fortran = true;
      } else if (key == "shape") {
        if (!ParseShape(&r.shape)) {
          return Err("'shape' must be a tuple of non-negative integers");
        }
        r.has_shape = true;
      } else {
        return Err(absl::StrCat("unexpected key '", key, "'"));
      }
      SkipSpace();
      if (Eat(',')) continue;
      SkipSpace();
      if (Eat('}')) break;
      return Err("expected ',' or '}'");
    }
    SkipSpace();
    if (pos_ != s_.size()) return Err("trailing characters after '}'");
    if (!r.has_descr || !r.has_fortran || !r.has_shape) {
      return Err("header dict must have 'descr', 'fortran_order' and 'shape'");
    }
    return r;
  }

 private:
  absl::Status Err(absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("malformed header (", why,
                                                   " at offset ", pos_,
                                                   "): ", absl::CEscape(s_)));
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           std::isspace(static_cast<unsigned char>(s_[pos_])))
      ++pos_;
  }
  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Consume(absl::string_view word) {
    if (s_.substr(pos_, word.size()) == word) {
      pos_ += word.size();
      return true;
    }
    return false;
  }
  bool ParseString(std::string* out) {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"'))
      return false;
    char quote = s_[pos_++];
    size_t end = s_.find(quote, pos_);
    if (end == absl::string_view::npos) return false;
    *out = std::string(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return true;
  }
  bool ParseInt(int64_t* out) {
    size_t start = pos_;
    while (pos_ < s_.size() &&
           std::isdigit(static_cast<unsigned char>(s_[pos_])))
      ++pos_;
    if (pos_ == start) return false;
    if (!absl::SimpleAtoi(s_.substr(start, pos_ - start), out)) return false;
    Eat('L');  // Python 2 long suffix in old files
    return true;
  }
  // "()", "(5,)", "(3, 4)", "(3, 4,)".
  bool ParseShape(Shape* shape) {
    if (!Eat('(')) return false;
    SkipSpace();
    if (Eat(')')) return true;
    for (;;) {
      SkipSpace();
      int64_t d;
      if (!ParseInt(&d)) return false;
      shape->push_back(d);
      SkipSpace();
      if (Eat(',')) {
        SkipSpace();
        if (Eat(')')) return true;
        continue;
      }
      if (Eat(')')) return shape->size() > 1;  // "(5)" is not a tuple
      return false;
    }
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

// The most of a file's unsupported descr an error quotes.
constexpr size_t kMaxQuotedDescr = 16;

// Sets `header`'s dtype and descr from the numpy descr.
absl::Status DTypeFromDescr(const std::string& path, const std::string& descr,
                            const NpyReadOptions& options, NpyHeader* header) {
  if (descr == "<f4") {
    header->dtype = DType::kFloat32;
  } else if (descr == "<i4") {
    header->dtype = DType::kInt32;
  } else if (descr == "<i8") {
    header->dtype = DType::kInt64;
  } else if (descr == "<f2" && options.float16) {
    header->dtype = DType::kFloat16;
  } else if ((descr == "<u2" || descr == "|V2" || descr == "<V2") &&
             options.bfloat16_words) {
    header->dtype = DType::kBFloat16;
  } else {
    return Bad(
        path,
        absl::StrCat("dtype '", absl::CEscape(descr.substr(0, kMaxQuotedDescr)),
                     descr.size() > kMaxQuotedDescr ? "..." : "",
                     "' is not supported (expected <f4, ",
                     options.float16 ? "<f2, " : "",
                     options.bfloat16_words ? "<u2 or |V2 (bfloat16), " : "",
                     "<i4 or <i8)"));
  }
  header->descr = descr;
  return absl::OkStatus();
}

const char* DescrOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "<f4";
    case DType::kInt32:
      return "<i4";
    case DType::kInt64:
      return "<i8";
    case DType::kFloat16:
      return "<f2";
    case DType::kBFloat16:  // numpy has no bfloat16: its bits as words
      return "<u2";
    default:
      return nullptr;
  }
}

uint32_t ReadLE(const unsigned char* p, int n) {
  uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Checks the magic and the version and returns the header dict's text;
// `data_offset` gets where the data begins. `file_size` is the whole file's
// size.
absl::StatusOr<absl::string_view> FindHeaderText(const std::string& path,
                                                 absl::string_view bytes,
                                                 uint64_t file_size,
                                                 size_t* data_offset) {
  if (bytes.size() < kMagicLen + 2 ||
      std::memcmp(bytes.data(), kMagic, kMagicLen) != 0) {
    return Bad(path, "not a .npy file (missing \\x93NUMPY magic)");
  }
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  const int major = u[6], minor = u[7];
  int len_bytes;
  if (major == 1 && minor == 0) {
    len_bytes = 2;
  } else if ((major == 2 || major == 3) && minor == 0) {
    len_bytes = 4;
  } else {
    return Bad(path, absl::StrCat("unsupported .npy format version ", major,
                                  ".", minor, " (expected 1.0, 2.0 or 3.0)"));
  }
  const size_t prefix = kMagicLen + 2 + len_bytes;
  if (bytes.size() < prefix) {
    return Bad(path, absl::StrCat("truncated: file has ", file_size,
                                  " bytes, too short for the header length"));
  }
  const uint64_t header_len = ReadLE(u + kMagicLen + 2, len_bytes);
  if (prefix + header_len > bytes.size()) {
    return Bad(path, absl::StrCat("truncated: header promises ", header_len,
                                  " header bytes, file has ", file_size,
                                  " bytes in all"));
  }
  *data_offset = prefix + header_len;
  return bytes.substr(prefix, header_len);
}

// Checks that the data `header` describes (of numpy dtype `descr`) exactly
// fills the rest of a file of `file_size` bytes.
absl::Status CheckDataSize(const std::string& path, const NpyHeader& header,
                           const std::string& descr, uint64_t file_size) {
  // Element count and byte size without overflow.
  const uint64_t elem = DTypeSize(header.dtype);
  uint64_t count = 1;
  for (int64_t d : header.shape) {
    if (d != 0 && count > std::numeric_limits<uint64_t>::max() / elem /
                              static_cast<uint64_t>(d)) {
      return Bad(path, absl::StrCat("shape ", ShapeToString(header.shape),
                                    " is too large"));
    }
    count *= static_cast<uint64_t>(d);
  }
  const uint64_t data_bytes = count * elem;
  const uint64_t have = file_size - header.data_offset;
  if (have < data_bytes) {
    return Bad(path, absl::StrCat("truncated: header promises ", data_bytes,
                                  " bytes of data (shape ",
                                  ShapeToString(header.shape), ", ", descr,
                                  "), file has ", have));
  }
  if (have > data_bytes) {
    return Bad(path, absl::StrCat("file has ", have - data_bytes,
                                  " unexpected bytes after the ", data_bytes,
                                  " bytes of data the header describes"));
  }
  return absl::OkStatus();
}

// Parses the header from the first bytes of the file; `file_size` is the
// whole file's size.
absl::StatusOr<NpyHeader> ParseHeader(const std::string& path,
                                      absl::string_view bytes,
                                      uint64_t file_size,
                                      const NpyReadOptions& options) {
  size_t data_offset = 0;
  ASSIGN_OR_RETURN(absl::string_view text,
                   FindHeaderText(path, bytes, file_size, &data_offset));
  HeaderDictParser parser(text);
  auto dict = parser.Parse();
  if (!dict.ok()) return Bad(path, dict.status().message());
  if (dict->fortran_order) {
    return Bad(path,
               "fortran_order is True; only C-order arrays are supported "
               "(save with np.ascontiguousarray)");
  }
  NpyHeader header;
  RETURN_IF_ERROR(DTypeFromDescr(path, dict->descr, options, &header));
  header.shape = dict->shape;
  header.data_offset = data_offset;
  RETURN_IF_ERROR(CheckDataSize(path, header, dict->descr, file_size));
  return header;
}

}  // namespace

absl::StatusOr<NpyHeader> ReadNpyHeader(const std::string& path,
                                        const NpyReadOptions& options) {
  // Version 1 headers are < 64 KiB; later ones could be larger, so read the
  // prefix first and then exactly the header.
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    std::string msg =
        absl::StrCat(path, ": cannot open: ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(msg)
                           : absl::InternalError(msg);
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(f, &std::fclose);
  ASSIGN_OR_RETURN(int64_t size, FileSize(path));
  std::string prefix(12, '\0');
  prefix.resize(std::fread(&prefix[0], 1, prefix.size(), f));
  uint64_t header_len = 0;
  if (prefix.size() >= 10 &&
      std::memcmp(prefix.data(), kMagic, kMagicLen) == 0) {
    const auto* u = reinterpret_cast<const unsigned char*>(prefix.data());
    header_len = u[6] == 1 ? ReadLE(u + 8, 2)
                           : (prefix.size() >= 12 ? ReadLE(u + 8, 4) : 0);
  }
  // Never read more than the file holds (a corrupt length is caught by
  // ParseHeader as truncation).
  uint64_t want = std::min<uint64_t>(12 + header_len, size);
  std::string bytes = prefix;
  if (want > bytes.size()) {
    size_t old = bytes.size();
    bytes.resize(want);
    bytes.resize(old + std::fread(&bytes[old], 1, want - old, f));
  }
  return ParseHeader(path, bytes, static_cast<uint64_t>(size), options);
}

float Float16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  uint32_t out;
  if (exponent == 0x1F) {  // inf, or NaN keeping its payload
    out = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    std::memcpy(&out, &magnitude, sizeof(out));
    out |= sign;
  }
  float f;
  std::memcpy(&f, &out, sizeof(f));
  return f;
}

uint16_t FloatToFloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t magnitude = u & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {  // NaN: the payload's top bits, never 0
    const uint16_t payload = static_cast<uint16_t>((magnitude >> 13) & 0x3FFu);
    return sign | 0x7C00u | (payload == 0 ? 1 : payload);
  }
  if (magnitude >= 0x47800000u) return sign | 0x7C00u;  // >= 2^16: inf
  if (magnitude >= 0x38800000u) {  // a normal half (>= 2^-14)
    // Rebias the exponent (127 -> 15) and round the mantissa's low 13
    // bits to nearest even; a carry into the exponent is right, up to inf.
    const uint32_t v = magnitude - 0x38000000u;
    return sign | static_cast<uint16_t>((v + 0x0FFFu + ((v >> 13) & 1u)) >> 13);
  }
  // A subnormal half counts units of 2^-24: the float's significand
  // (implicit bit included) shifted right, rounded to nearest even. Below
  // 2^-25 (half a unit) everything rounds to zero.
  const int exponent = static_cast<int>(magnitude >> 23);
  if (exponent < 102) return sign;
  const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  const int shift = 126 - exponent;  // 14 .. 24
  uint32_t units = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1);
  const uint32_t tie = 1u << (shift - 1);
  if (rest > tie || (rest == tie && (units & 1u))) ++units;
  return sign | static_cast<uint16_t>(units);  // 0x400: the smallest normal
}

absl::StatusOr<Tensor> ReadNpy(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  ASSIGN_OR_RETURN(NpyHeader header,
                   ParseHeader(path, bytes, bytes.size(), NpyReadOptions()));
  absl::StatusOr<Tensor> t = Tensor::Create(header.dtype, header.shape);
  if (!t.ok()) {
    return Prefixed(t.status(), absl::StrCat(path, ": "));
  }
  if (t->nbytes() > 0) {
    std::memcpy(t->raw_data(), bytes.data() + header.data_offset, t->nbytes());
  }
  return t;
}

absl::StatusOr<std::string> NpyHeaderBytes(DType dtype, const Shape& shape,
                                           size_t min_bytes) {
  const char* descr = DescrOf(dtype);
  if (descr == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot write dtype ", DTypeName(dtype),
        " to .npy (supported: float32, int32, int64, float16, bfloat16)"));
  }
  const std::string dims =
      shape.size() == 1 ? absl::StrCat("(", shape[0], ",)")
                        : absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
  std::string dict =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': ", dims, ", }");
  // numpy pads with spaces and a final '\n' so the data starts at a multiple
  // of 64 bytes.
  const size_t prefix = kMagicLen + 2 + 2;
  const size_t total = prefix + dict.size() + 1;
  const size_t padded = (std::max(total, min_bytes) + 63) / 64 * 64;
  dict.append(padded - total, ' ');
  dict.push_back('\n');
  if (dict.size() > 0xFFFF) {
    return absl::InvalidArgumentError("header too long for .npy 1.0");
  }
  std::string out(kMagic, kMagicLen);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(dict.size() & 0xFF));
  out.push_back(static_cast<char>(dict.size() >> 8));
  return out + dict;
}

absl::Status WriteNpy(const std::string& path, const Tensor& tensor) {
  if (!tensor.device().is_cpu()) {
    return Bad(path, absl::StrCat("tensor is on ", tensor.device().ToString(),
                                  "; copy it to the CPU first"));
  }
  absl::StatusOr<std::string> header =
      NpyHeaderBytes(tensor.dtype(), tensor.shape());
  if (!header.ok()) return Bad(path, header.status().message());
  std::string out = *std::move(header);
  if (tensor.nbytes() > 0) {
    out.append(static_cast<const char*>(tensor.raw_data()), tensor.nbytes());
  }
  return WriteFileAtomically(path, out);
}

}  // namespace trainyard
