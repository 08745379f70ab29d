#include "cli/npy_split.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cli/shard_inspect.h"
#include "core/npy.h"
#include "core/status_macros.h"
#include "core/tensor.h"

namespace trainyard {
namespace {

constexpr size_t kChunkBytes = 1 << 20;

using FilePtr = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

absl::Status Bad(const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
}

// The two headers of an input pair, checked against each other and against
// `layout` (filled from the first pair when `first`).
absl::StatusOr<int64_t> CheckPair(const std::string& x_path,
                                  const std::string& y_path, bool first,
                                  ShardLayout* layout) {
  ASSIGN_OR_RETURN(NpyHeader x, ReadNpyHeader(x_path));
  ASSIGN_OR_RETURN(NpyHeader y, ReadNpyHeader(y_path));
  RETURN_IF_ERROR(
      CheckShardPairShapes(x_path, x.dtype, x.shape, y_path, y.dtype, y.shape));
  const int64_t width = y.dtype == DType::kInt64 ? 0 : y.shape[1];
  if (first) {
    layout->features = x.shape[1];
    layout->target_dtype = y.dtype;
    layout->target_width = width;
  } else if (x.shape[1] != layout->features) {
    return Bad(x_path, absl::StrCat(x.shape[1],
                                    " features per row, the first "
                                    "file has ",
                                    layout->features));
  } else if (y.dtype != layout->target_dtype || width != layout->target_width) {
    return Bad(y_path, absl::StrCat("targets ", DTypeName(y.dtype), " ",
                                    ShapeToString(y.shape),
                                    " differ from the first file's"));
  }
  return x.shape[0];
}

// `path` opened at its data.
absl::StatusOr<FilePtr> OpenAtData(const std::string& path) {
  ASSIGN_OR_RETURN(NpyHeader header, ReadNpyHeader(path));
  FilePtr file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (file == nullptr ||
      std::fseek(file.get(), static_cast<long>(header.data_offset), SEEK_SET) !=
          0) {
    return absl::InternalError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  return file;
}

absl::Status ReadExactly(std::FILE* file, const std::string& path, char* out,
                         size_t bytes) {
  if (std::fread(out, 1, bytes, file) != bytes) {
    return absl::InternalError(
        absl::StrCat(path, ": read failed or file shrank while being read"));
  }
  return absl::OkStatus();
}

// Streams the `rows` rows of one checked input pair into `writer`.
absl::Status CopyPair(const std::string& x_path, const std::string& y_path,
                      int64_t rows, const ShardLayout& layout,
                      ShardWriter& writer) {
  ASSIGN_OR_RETURN(FilePtr x_file, OpenAtData(x_path));
  ASSIGN_OR_RETURN(FilePtr y_file, OpenAtData(y_path));
  const size_t x_row = sizeof(float) * layout.features;
  const size_t y_row = layout.target_dtype == DType::kInt64
                           ? sizeof(int64_t)
                           : sizeof(float) * layout.target_width;
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / (x_row + y_row));
  std::vector<float> x(chunk * layout.features);
  std::vector<char> y(chunk * y_row);
  for (int64_t done = 0; done < rows;) {
    const int64_t n = std::min(chunk, rows - done);
    RETURN_IF_ERROR(ReadExactly(x_file.get(), x_path,
                                reinterpret_cast<char*>(x.data()), n * x_row));
    RETURN_IF_ERROR(ReadExactly(y_file.get(), y_path, y.data(), n * y_row));
    RETURN_IF_ERROR(writer.Append(x.data(), y.data(), n));
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<ShardPair>> SplitNpyPairs(
    const std::vector<std::string>& features,
    const std::vector<std::string>& targets, const std::string& out_dir,
    int64_t shard_rows, DType features_dtype,
    ShardWriter::ProgressFn progress) {
  if (features.empty() || features.size() != targets.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("give as many targets files as features files (got ",
                     features.size(), " and ", targets.size(), ")"));
  }
  ShardLayout layout;
  layout.shard_rows = shard_rows;
  layout.features_dtype = features_dtype;
  std::vector<int64_t> rows;
  int64_t total = 0;
  for (size_t i = 0; i < features.size(); ++i) {
    ASSIGN_OR_RETURN(int64_t n,
                     CheckPair(features[i], targets[i], i == 0, &layout));
    rows.push_back(n);
    total += n;
  }
  if (total == 0) return Bad(features[0], "no rows to convert");
  ASSIGN_OR_RETURN(std::unique_ptr<ShardWriter> writer,
                   ShardWriter::Create(out_dir, layout, std::move(progress)));
  for (size_t i = 0; i < features.size(); ++i) {
    RETURN_IF_ERROR(
        CopyPair(features[i], targets[i], rows[i], layout, *writer));
  }
  return writer->Finish();
}

}  // namespace trainyard
