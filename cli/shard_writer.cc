#include "cli/shard_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/bfloat16.h"
#include "core/file_util.h"
#include "core/npy.h"
#include "core/sha256.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace trainyard {
namespace {

using json = nlohmann::ordered_json;

constexpr char kShardsJson[] = "shards.json";
constexpr char kFormat[] = "trainyard-shards-v1";

// Every shard's .npy header takes this many bytes (numpy aligns the data to
// 64 bytes; the longest possible 2-D header fits), so a shard's rows can be
// streamed before its row count, and so its header, is known.
constexpr size_t kNpyHeaderBytes = 128;

absl::Status ErrnoError(const std::string& path, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat(path, ": ", what, ": ", std::strerror(errno)));
}

// A shard's .npy header (core/npy), exactly kNpyHeaderBytes long.
absl::StatusOr<std::string> ShardHeader(DType dtype, const Shape& shape) {
  ASSIGN_OR_RETURN(std::string header,
                   NpyHeaderBytes(dtype, shape, kNpyHeaderBytes));
  if (header.size() != kNpyHeaderBytes) {
    return absl::InternalError(
        absl::StrCat("a shard's .npy header for ", ShapeToString(shape), " is ",
                     header.size(), " bytes, not ", kNpyHeaderBytes));
  }
  return header;
}

std::string TempName(const std::string& dir, char kind, int64_t index) {
  return JoinPath(dir, absl::StrCat(".", ShardFileName(kind, index), ".tmp"));
}

// Writes the final header of `file` (open at `tmp`), flushes and fsyncs it,
// closes it and renames it to `path`.
absl::Status CompleteFile(std::FILE* file, const std::string& tmp,
                          const std::string& header, const std::string& path) {
  bool ok =
      std::fseek(file, 0, SEEK_SET) == 0 &&
      std::fwrite(header.data(), 1, header.size(), file) == header.size() &&
      std::fflush(file) == 0 && ::fsync(::fileno(file)) == 0;
  const int saved = errno;
  ok = (std::fclose(file) == 0) && ok;
  if (!ok) {
    errno = saved;
    return ErrnoError(tmp, "cannot write");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoError(path, "cannot rename the temp file into place");
  }
  return absl::OkStatus();
}

absl::Status CheckLayout(const ShardLayout& layout) {
  if (layout.shard_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard rows must be >= 1, got ", layout.shard_rows));
  }
  if (layout.features < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("features per row must be >= 1, got ", layout.features));
  }
  if (layout.features_dtype != DType::kFloat32 &&
      layout.features_dtype != DType::kFloat16 &&
      layout.features_dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("features are stored as float32, float16 or bfloat16, "
                     "not ",
                     DTypeName(layout.features_dtype)));
  }
  const bool classes = layout.target_dtype == DType::kInt64;
  if (!classes && layout.target_dtype != DType::kFloat32) {
    return absl::InvalidArgumentError("targets must be int64 or float32");
  }
  if (classes ? layout.target_width != 0 : layout.target_width < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target width must be 0 for int64 class ids and >= 1 for float32 "
        "targets, got ",
        layout.target_width));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ShardFileName(char kind, int64_t index) {
  return absl::StrFormat("%c-%05d.npy", kind, index);
}

absl::StatusOr<std::unique_ptr<ShardWriter>> ShardWriter::Create(
    const std::string& dir, const ShardLayout& layout, ProgressFn progress) {
  RETURN_IF_ERROR(CheckLayout(layout));
  struct stat st;
  bool made_dir = false;
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, ": exists and is not a folder"));
    }
    ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(dir));
    if (!names.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, ": exists and is not empty (it holds \"", names[0],
                       "\"); give a new or empty folder"));
    }
  } else if (errno == ENOENT) {
    RETURN_IF_ERROR(CreateDirectories(dir));
    made_dir = true;
  } else {
    return ErrnoError(dir, "cannot stat");
  }
  return std::unique_ptr<ShardWriter>(
      new ShardWriter(dir, layout, made_dir, std::move(progress)));
}

ShardWriter::ShardWriter(std::string dir, ShardLayout layout, bool made_dir,
                         ProgressFn progress)
    : dir_(std::move(dir)),
      layout_(layout),
      made_dir_(made_dir),
      progress_(std::move(progress)) {}

ShardWriter::~ShardWriter() {
  if (!finished_) RemoveWritten();
}

void ShardWriter::RemoveWritten() {
  if (x_file_ != nullptr) std::fclose(x_file_);
  if (y_file_ != nullptr) std::fclose(y_file_);
  x_file_ = y_file_ = nullptr;
  for (const std::string& path : written_) std::remove(path.c_str());
  if (made_dir_) ::rmdir(dir_.c_str());  // only if nothing else is in it
}

absl::Status ShardWriter::OpenShard() {
  const int64_t index = static_cast<int64_t>(pairs_.size());
  const std::string zeros(kNpyHeaderBytes, '\0');
  for (char kind : {'x', 'y'}) {
    const std::string tmp = TempName(dir_, kind, index);
    std::FILE* file = std::fopen(tmp.c_str(), "wbx");
    if (file == nullptr) return ErrnoError(tmp, "cannot create");
    written_.push_back(tmp);
    (kind == 'x' ? x_file_ : y_file_) = file;
    if (std::fwrite(zeros.data(), 1, zeros.size(), file) != zeros.size()) {
      return ErrnoError(tmp, "cannot write");
    }
  }
  return absl::OkStatus();
}

absl::Status ShardWriter::CloseShard() {
  const int64_t index = static_cast<int64_t>(pairs_.size());
  const int64_t n = shard_fill_;
  ShardPair pair;
  pair.features_file = ShardFileName('x', index);
  pair.targets_file = ShardFileName('y', index);
  pair.rows = n;
  pair.overflowed = overflowed_;
  const std::string x_path = JoinPath(dir_, pair.features_file);
  const std::string y_path = JoinPath(dir_, pair.targets_file);
  written_.push_back(x_path);
  written_.push_back(y_path);
  const bool classes = layout_.target_dtype == DType::kInt64;
  ASSIGN_OR_RETURN(const std::string x_header,
                   ShardHeader(layout_.features_dtype, {n, layout_.features}));
  ASSIGN_OR_RETURN(
      const std::string y_header,
      classes ? ShardHeader(DType::kInt64, {n})
              : ShardHeader(DType::kFloat32, {n, layout_.target_width}));
  std::FILE* x = x_file_;
  std::FILE* y = y_file_;
  x_file_ = y_file_ = nullptr;
  const absl::Status x_status =
      CompleteFile(x, TempName(dir_, 'x', index), x_header, x_path);
  const absl::Status y_status =
      CompleteFile(y, TempName(dir_, 'y', index), y_header, y_path);
  RETURN_IF_ERROR(x_status);
  RETURN_IF_ERROR(y_status);
  RETURN_IF_ERROR(SyncDirectory(dir_));
  ASSIGN_OR_RETURN(pair.features_bytes, FileSize(x_path));
  ASSIGN_OR_RETURN(pair.targets_bytes, FileSize(y_path));
  ASSIGN_OR_RETURN(pair.features_sha256, Sha256HexOfFile(x_path));
  ASSIGN_OR_RETURN(pair.targets_sha256, Sha256HexOfFile(y_path));
  pairs_.push_back(std::move(pair));
  shard_fill_ = 0;
  overflowed_ = 0;
  return absl::OkStatus();
}

absl::Status ShardWriter::WriteFeatures(const float* features, int64_t n) {
  const int64_t index = static_cast<int64_t>(pairs_.size());
  const size_t count = static_cast<size_t>(n * layout_.features);
  if (layout_.features_dtype == DType::kFloat32) {
    if (std::fwrite(features, sizeof(float), count, x_file_) != count) {
      return ErrnoError(TempName(dir_, 'x', index), "cannot write");
    }
    return absl::OkStatus();
  }
  const bool bf16 = layout_.features_dtype == DType::kBFloat16;
  const uint16_t inf = bf16 ? 0x7F80 : 0x7C00;
  narrowed_.resize(std::max(narrowed_.size(), count));
  for (size_t i = 0; i < count; ++i) {
    const uint16_t h =
        bf16 ? FloatToBf16(features[i]) : FloatToFloat16(features[i]);
    if ((h & 0x7FFF) == inf && std::isfinite(features[i])) ++overflowed_;
    narrowed_[i] = h;
  }
  if (std::fwrite(narrowed_.data(), sizeof(uint16_t), count, x_file_) !=
      count) {
    return ErrnoError(TempName(dir_, 'x', index), "cannot write");
  }
  return absl::OkStatus();
}

absl::Status ShardWriter::Append(const float* features, const void* targets,
                                 int64_t n) {
  const size_t y_row = layout_.target_dtype == DType::kInt64
                           ? sizeof(int64_t)
                           : sizeof(float) * layout_.target_width;
  const float* x = features;
  const char* y = static_cast<const char*>(targets);
  while (n > 0) {
    if (shard_fill_ == 0) RETURN_IF_ERROR(OpenShard());
    const int64_t take = std::min(n, layout_.shard_rows - shard_fill_);
    const int64_t index = static_cast<int64_t>(pairs_.size());
    RETURN_IF_ERROR(WriteFeatures(x, take));
    if (std::fwrite(y, y_row, take, y_file_) != static_cast<size_t>(take)) {
      return ErrnoError(TempName(dir_, 'y', index), "cannot write");
    }
    x += layout_.features * take;
    y += y_row * take;
    n -= take;
    rows_ += take;
    shard_fill_ += take;
    if (shard_fill_ == layout_.shard_rows) RETURN_IF_ERROR(CloseShard());
  }
  if (progress_) progress_(rows_);
  return absl::OkStatus();
}

absl::Status ShardWriter::WriteShardsJson() {
  json targets = {
      {"dtype", layout_.target_dtype == DType::kInt64 ? "int64" : "float32"}};
  if (layout_.target_dtype == DType::kFloat32) {
    targets["width"] = layout_.target_width;
  }
  json shards = json::array();
  for (const ShardPair& p : pairs_) {
    shards.push_back({{"rows", p.rows},
                      {"features",
                       {{"file", p.features_file},
                        {"bytes", p.features_bytes},
                        {"sha256", p.features_sha256}}},
                      {"targets",
                       {{"file", p.targets_file},
                        {"bytes", p.targets_bytes},
                        {"sha256", p.targets_sha256}}}});
  }
  const json doc = {{"format", kFormat},
                    {"rows", rows_},
                    {"shard_rows", layout_.shard_rows},
                    {"features",
                     {{"dtype", DTypeName(layout_.features_dtype)},
                      {"width", layout_.features}}},
                    {"targets", targets},
                    {"shards", shards}};
  const std::string path = JoinPath(dir_, kShardsJson);
  written_.push_back(path);
  return WriteFileAtomically(path, doc.dump(2) + "\n");
}

absl::StatusOr<std::vector<ShardPair>> ShardWriter::Finish() {
  if (shard_fill_ > 0) RETURN_IF_ERROR(CloseShard());
  RETURN_IF_ERROR(WriteShardsJson());
  finished_ = true;
  return pairs_;
}

}  // namespace trainyard
