#include "core/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

namespace trainyard {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr char kMetadataKey[] = "__metadata__";
// The Python/Rust implementation refuses headers above 100 MB too.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

const char* SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kBFloat16:
      return "BF16";
    case DType::kInt32:
      return "I32";
    case DType::kInt64:
      return "I64";
    case DType::kUInt8:
      return "U8";
    case DType::kFloat64:
      return "F64";
    case DType::kFloat16:
      return "F16";
  }
  return "?";
}

bool DTypeFromSafetensorsName(const std::string& name, DType* out) {
  for (DType d : kAllDTypes) {
    if (name == SafetensorsDTypeName(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

absl::Status Bad(const std::string& source, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", why));
}

absl::Status BadTensor(const std::string& source, const std::string& tensor,
                       absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": tensor \"", tensor, "\": ", why));
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// Reads `v` as a shape array into `shape`; returns the element count, which
// is small enough that its byte size cannot overflow.
absl::StatusOr<uint64_t> ParseShape(const std::string& source,
                                    const std::string& name, const json& v,
                                    Shape* shape) {
  uint64_t count = 1;
  for (const json& d : v) {
    if (!d.is_number_unsigned()) {
      return BadTensor(source, name,
                       absl::StrCat("shape entries must be non-negative "
                                    "integers, got ",
                                    d.dump()));
    }
    uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (dim != 0 && count > std::numeric_limits<uint64_t>::max() / 8 / dim)) {
      return BadTensor(source, name,
                       absl::StrCat("shape ", v.dump(), " is too large"));
    }
    count *= dim;
    shape->push_back(static_cast<int64_t>(dim));
  }
  return count;
}

absl::StatusOr<Entry> ParseEntry(const std::string& source,
                                 const std::string& name, const json& v) {
  Entry e;
  e.name = name;
  if (!v.is_object()) return BadTensor(source, name, "entry is not an object");
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) {
    return BadTensor(source, name, "missing string field \"dtype\"");
  }
  const std::string dtype_name = dt->get<std::string>();
  if (!DTypeFromSafetensorsName(dtype_name, &e.dtype)) {
    return BadTensor(source, name,
                     absl::StrCat("dtype ", dtype_name,
                                  " is not supported (expected F32, BF16, I32, "
                                  "I64 or U8)"));
  }
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) {
    return BadTensor(source, name, "missing array field \"shape\"");
  }
  ASSIGN_OR_RETURN(const uint64_t count,
                   ParseShape(source, name, *sh, &e.shape));
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 ||
      !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
    return BadTensor(source, name,
                     "\"data_offsets\" must be [begin, end], two non-negative "
                     "integers");
  }
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.end < e.begin) {
    return BadTensor(source, name,
                     absl::StrCat("data_offsets [", e.begin, ", ", e.end,
                                  "] end before they begin"));
  }
  const uint64_t want = count * DTypeSize(e.dtype);
  if (e.end - e.begin != want) {
    return BadTensor(source, name,
                     absl::StrCat("data_offsets [", e.begin, ", ", e.end,
                                  "] span ", e.end - e.begin,
                                  " bytes but shape ", ShapeToString(e.shape),
                                  " of ", dtype_name, " needs ", want));
  }
  return e;
}

// Reads the little-endian header length from the first 8 bytes and checks
// that a header of that length fits in `bytes`.
absl::StatusOr<uint64_t> ReadHeaderLength(absl::string_view bytes,
                                          const std::string& source) {
  if (bytes.size() < 8) {
    return Bad(source, absl::StrCat("truncated: ", bytes.size(),
                                    " bytes, too short for the 8-byte header "
                                    "length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<unsigned char>(bytes[i]);
  }
  // The length's value is not quoted: for a file that is not safetensors
  // it is the file's first 8 bytes, which an error must not give away.
  if (header_len > kMaxHeaderBytes) {
    return Bad(source,
               "its 8-byte header length exceeds the 100 MiB limit (corrupt "
               "or not a safetensors file)");
  }
  if (header_len > bytes.size() - 8) {
    return Bad(source, absl::StrCat("truncated: its header length is more "
                                    "than the ",
                                    bytes.size() - 8, " bytes that follow"));
  }
  return header_len;
}

// Parses the header JSON, which must be an object without duplicate keys.
absl::StatusOr<json> ParseHeaderJson(const std::string& header_text,
                                     const std::string& source) {
  // Track top-level keys to reject duplicates (the JSON library would keep
  // the last one silently).
  std::set<std::string> keys;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event,
                                   json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      const std::string key = parsed.get<std::string>();
      if (!keys.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json header = json::parse(header_text, cb, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return Bad(source, "header is not valid JSON");
  }
  if (!header.is_object()) return Bad(source, "header JSON is not an object");
  if (!duplicate.empty()) {
    return Bad(source, absl::StrCat("header names \"", duplicate, "\" twice"));
  }
  return header;
}

// Copies the "__metadata__" object `v`, whose values must be strings.
absl::Status ParseMetadata(const std::string& source, const json& v,
                           std::map<std::string, std::string>* metadata) {
  if (!v.is_object()) return Bad(source, "__metadata__ is not an object");
  for (auto m = v.begin(); m != v.end(); ++m) {
    if (!m->is_string()) {
      return Bad(source, absl::StrCat("__metadata__ value \"", m.key(),
                                      "\" is not a string"));
    }
    (*metadata)[m.key()] = m->get<std::string>();
  }
  return absl::OkStatus();
}

// Copies each entry's bytes out of the data section into `tensors`, checking
// that the entries, sorted by offset, tile the whole section.
absl::Status CopyTensors(const std::string& source, std::vector<Entry> entries,
                         absl::string_view data,
                         std::vector<std::pair<std::string, Tensor>>* tensors) {
  std::stable_sort(
      entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
      });
  const uint64_t data_size = data.size();
  uint64_t expect = 0;
  for (const Entry& e : entries) {
    if (e.begin != expect) {
      return BadTensor(
          source, e.name,
          absl::StrCat("data_offsets begin at ", e.begin, ", expected ", expect,
                       e.begin < expect ? " (overlaps the previous tensor)"
                                        : " (gap after the previous tensor)"));
    }
    if (e.end > data_size) {
      return BadTensor(
          source, e.name,
          absl::StrCat("truncated: data_offsets end at ", e.end,
                       " but the data section has only ", data_size, " bytes"));
    }
    absl::StatusOr<Tensor> t = Tensor::Create(e.dtype, e.shape);
    if (!t.ok()) return BadTensor(source, e.name, t.status().message());
    if (t->nbytes() > 0) {
      std::memcpy(t->raw_data(), data.data() + e.begin, t->nbytes());
    }
    tensors->emplace_back(e.name, *std::move(t));
    expect = e.end;
  }
  if (expect != data_size) {
    return Bad(source, absl::StrCat("data section has ", data_size,
                                    " bytes but the tensors cover ", expect,
                                    " (trailing bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> SafetensorsFile::Get(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  return absl::NotFoundError(absl::StrCat("no tensor named \"", name, "\""));
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes,
                                                 const std::string& source) {
  ASSIGN_OR_RETURN(const uint64_t header_len, ReadHeaderLength(bytes, source));
  const std::string header_text(bytes.substr(8, header_len));
  ASSIGN_OR_RETURN(const json header, ParseHeaderJson(header_text, source));
  SafetensorsFile file;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      RETURN_IF_ERROR(ParseMetadata(source, it.value(), &file.metadata));
      continue;
    }
    ASSIGN_OR_RETURN(Entry e, ParseEntry(source, it.key(), it.value()));
    entries.push_back(std::move(e));
  }
  RETURN_IF_ERROR(CopyTensors(source, std::move(entries),
                              bytes.substr(8 + header_len), &file.tensors));
  return file;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  return ParseSafetensors(bytes, path);
}

absl::Status ValidateSafetensors(const SafetensorsFile& file) {
  std::set<std::string> names;
  for (const auto& [name, t] : file.tensors) {
    if (name.empty()) return absl::InvalidArgumentError("empty tensor name");
    if (name == kMetadataKey) {
      return absl::InvalidArgumentError(
          "a tensor may not be called \"__metadata__\"");
    }
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\" appears twice"));
    }
    if (!t.device().is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\" is on ", t.device().ToString(),
                       "; copy it to the CPU first"));
    }
  }
  return absl::OkStatus();
}

namespace {

// The 8-byte length and the padded JSON header of `file`; `data_bytes` gets
// the size of the tensor data that follows.
std::string SafetensorsPrefix(const SafetensorsFile& file,
                              uint64_t* data_bytes) {
  ordered_json header = ordered_json::object();
  if (!file.metadata.empty()) {
    ordered_json meta = ordered_json::object();
    for (const auto& [k, v] : file.metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    ordered_json entry = ordered_json::object();
    entry["dtype"] = SafetensorsDTypeName(t.dtype());
    entry["shape"] = t.shape();
    entry["data_offsets"] = {offset, offset + t.nbytes()};
    header[name] = std::move(entry);
    offset += t.nbytes();
  }
  // Invalid UTF-8 in names is replaced rather than thrown on.
  std::string text =
      header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(len >> (8 * i)));
  out += text;
  *data_bytes = offset;
  return out;
}

}  // namespace

std::string SerializeSafetensors(const SafetensorsFile& file) {
  absl::Status valid = ValidateSafetensors(file);
  CHECK(valid.ok()) << valid;
  uint64_t data_bytes = 0;
  std::string out = SafetensorsPrefix(file, &data_bytes);
  out.reserve(out.size() + data_bytes);
  for (const auto& [name, t] : file.tensors) {
    if (t.nbytes() > 0) {
      out.append(static_cast<const char*>(t.raw_data()), t.nbytes());
    }
  }
  return out;
}

absl::StatusOr<Tensor> SerializeSafetensorsToTensor(
    const SafetensorsFile& file) {
  absl::Status valid = ValidateSafetensors(file);
  CHECK(valid.ok()) << valid;
  uint64_t data_bytes = 0;
  const std::string prefix = SafetensorsPrefix(file, &data_bytes);
  ASSIGN_OR_RETURN(
      Tensor out,
      Tensor::Create(DType::kUInt8,
                     {static_cast<int64_t>(prefix.size() + data_bytes)}));
  char* p = static_cast<char*>(out.raw_data());
  std::memcpy(p, prefix.data(), prefix.size());
  p += prefix.size();
  for (const auto& [name, t] : file.tensors) {
    if (t.nbytes() > 0) {
      std::memcpy(p, t.raw_data(), t.nbytes());
      p += t.nbytes();
    }
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path,
                              const SafetensorsFile& file) {
  absl::Status valid = ValidateSafetensors(file);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot write: ", valid.message()));
  }
  return WriteFileAtomically(path, SerializeSafetensors(file));
}

}  // namespace trainyard
