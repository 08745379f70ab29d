#include "cli/shard_inspect.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/npy.h"
#include "core/sha256.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace trainyard {
namespace {

using json = nlohmann::json;

bool IsFolder(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Shard order: by folder, then by index (x-100000.npy after x-99999.npy).
bool ShardOrder(const std::pair<std::string, std::string>& a,
                const std::pair<std::string, std::string>& b) {
  const std::string da = Dirname(a.first), db = Dirname(b.first);
  if (da != db) return da < db;
  const std::string na = Basename(a.first), nb = Basename(b.first);
  if (na.size() != nb.size()) return na.size() < nb.size();
  return na < nb;
}

absl::StatusOr<std::vector<std::string>> Glob(const std::string& pattern) {
  glob_t g;
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  if (rc == GLOB_NOMATCH) {
    return absl::NotFoundError(absl::StrCat(pattern, ": no files match"));
  }
  if (rc != 0) {
    return absl::InternalError(absl::StrCat(pattern, ": glob failed"));
  }
  std::vector<std::string> out(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  return out;
}

absl::Status Bad(const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
}

// The file's rows and sha256 from one shards.json entry's "features" or
// "targets" object; false when the entry is malformed.
bool AddListed(const json& entry, const char* key,
               absl::flat_hash_map<std::string, int64_t>* rows,
               absl::flat_hash_map<std::string, std::string>* sha) {
  if (!entry.is_object() || !entry.contains(key) || !entry.contains("rows") ||
      !entry["rows"].is_number_integer()) {
    return false;
  }
  const json& file = entry[key];
  if (!file.is_object() || !file.contains("file") ||
      !file["file"].is_string() || !file.contains("sha256") ||
      !file["sha256"].is_string()) {
    return false;
  }
  (*rows)[file["file"].get<std::string>()] = entry["rows"].get<int64_t>();
  (*sha)[file["file"].get<std::string>()] = file["sha256"].get<std::string>();
  return true;
}

// How .npy headers spell features of `dtype`.
const char* FeatureDescrs(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return "'<u2' or '|V2'";
    case DType::kFloat16:
      return "'<f2'";
    default:
      return "'<f4'";
  }
}

}  // namespace

absl::Status CheckShardPairShapes(const std::string& features, DType x_dtype,
                                  const Shape& x_shape,
                                  const std::string& targets, DType y_dtype,
                                  const Shape& y_shape) {
  const bool floats_x = x_dtype == DType::kFloat32 ||
                        x_dtype == DType::kFloat16 ||
                        x_dtype == DType::kBFloat16;
  if (!floats_x || x_shape.size() != 2 || x_shape[1] < 1) {
    return Bad(features,
               absl::StrCat("features must be float32, float16 or bfloat16 "
                            "[n, D], got ",
                            DTypeName(x_dtype), " ", ShapeToString(x_shape)));
  }
  const bool classes = y_dtype == DType::kInt64 && y_shape.size() == 1;
  const bool floats =
      y_dtype == DType::kFloat32 && y_shape.size() == 2 && y_shape[1] >= 1;
  if (!classes && !floats) {
    return Bad(targets,
               absl::StrCat("targets must be int64 [n] or float32 "
                            "[n, K], got ",
                            DTypeName(y_dtype), " ", ShapeToString(y_shape)));
  }
  if (y_shape[0] != x_shape[0]) {
    return Bad(targets, absl::StrCat(y_shape[0], " rows, but ",
                                     Basename(features), " has ", x_shape[0]));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> FindShardPairs(
    const std::string& dir_or_glob) {
  const std::string pattern =
      IsFolder(dir_or_glob) ? JoinPath(dir_or_glob, "[xy]-*.npy") : dir_or_glob;
  ASSIGN_OR_RETURN(std::vector<std::string> matches, Glob(pattern));
  std::set<std::pair<std::string, std::string>> pairs;
  for (const std::string& path : matches) {
    const std::string base = Basename(path);
    if (!(absl::StartsWith(base, "x-") || absl::StartsWith(base, "y-")) ||
        !absl::EndsWith(base, ".npy")) {
      continue;
    }
    const std::string dir = Dirname(path);
    const std::string x = JoinPath(dir, absl::StrCat("x", base.substr(1)));
    const std::string y = JoinPath(dir, absl::StrCat("y", base.substr(1)));
    const std::string& partner = base[0] == 'x' ? y : x;
    if (!Exists(partner)) {
      return Bad(path, absl::StrCat("its pair ", Basename(partner),
                                    " does not exist"));
    }
    pairs.emplace(x, y);
  }
  if (pairs.empty()) {
    return absl::NotFoundError(absl::StrCat(
        pattern, ": no shard pairs (x-NNNNN.npy with y-NNNNN.npy) match"));
  }
  std::vector<std::pair<std::string, std::string>> out(pairs.begin(),
                                                       pairs.end());
  std::sort(out.begin(), out.end(), ShardOrder);
  return out;
}

absl::StatusOr<const ShardInspector::Listing*> ShardInspector::ListingOf(
    const std::string& dir) {
  auto it = listings_.find(dir);
  if (it != listings_.end()) return &it->second;
  Listing& listing = listings_[dir];
  const std::string path = JoinPath(dir, "shards.json");
  if (!Exists(path)) return &listing;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("shards") ||
      !doc["shards"].is_array()) {
    listings_.erase(dir);
    return Bad(path, "not a shards.json (no \"shards\" list)");
  }
  absl::flat_hash_map<std::string, int64_t> rows;
  absl::flat_hash_map<std::string, std::string> sha;
  for (const json& entry : doc["shards"]) {
    if (!AddListed(entry, "features", &rows, &sha) ||
        !AddListed(entry, "targets", &rows, &sha)) {
      listings_.erase(dir);
      return Bad(path, "a shard entry lacks rows, file or sha256");
    }
  }
  for (const auto& [name, n] : rows) listing[name] = Listed{n, sha[name]};
  return &listing;
}

absl::Status ShardInspector::CheckFeaturesDType(const std::string& path,
                                                const NpyHeader& header) const {
  if (!features_dtype_.has_value()) {
    if (header.dtype != DType::kBFloat16) return absl::OkStatus();
    return Bad(path, absl::StrCat("dtype '", header.descr,
                                  "' holds 2-byte words: pass "
                                  "--features_dtype bfloat16 if they are "
                                  "bfloat16 features"));
  }
  if (header.dtype == *features_dtype_) return absl::OkStatus();
  return Bad(
      path, absl::StrCat("dtype '", header.descr, "', but --features_dtype is ",
                         DTypeName(*features_dtype_), " (expected ",
                         FeatureDescrs(*features_dtype_), ")"));
}

absl::StatusOr<ShardFileInfo> ShardInspector::InspectFile(
    const std::string& path, bool features) {
  ShardFileInfo info;
  info.path = path;
  NpyReadOptions options;  // targets: the plain dtypes
  options.float16 = options.bfloat16_words = features;
  ASSIGN_OR_RETURN(NpyHeader header, ReadNpyHeader(path, options));
  if (features) RETURN_IF_ERROR(CheckFeaturesDType(path, header));
  info.dtype = header.dtype;
  info.shape = header.shape;
  ASSIGN_OR_RETURN(info.bytes, FileSize(path));
  ASSIGN_OR_RETURN(info.sha256, Sha256HexOfFile(path));
  ASSIGN_OR_RETURN(const Listing* listing, ListingOf(Dirname(path)));
  auto it = listing->find(Basename(path));
  if (it == listing->end()) return info;
  if (it->second.rows != (info.shape.empty() ? -1 : info.shape[0])) {
    return Bad(path, absl::StrCat("shape ", ShapeToString(info.shape),
                                  ", but shards.json lists ", it->second.rows,
                                  " rows"));
  }
  if (it->second.sha256 != info.sha256) {
    return Bad(path, absl::StrCat("sha256 ", info.sha256,
                                  " differs from shards.json's ",
                                  it->second.sha256.substr(0, 64)));
  }
  return info;
}

absl::StatusOr<ShardPairInfo> ShardInspector::Inspect(
    const std::string& features, const std::string& targets) {
  ShardPairInfo pair;
  ASSIGN_OR_RETURN(pair.features, InspectFile(features, /*features=*/true));
  ASSIGN_OR_RETURN(pair.targets, InspectFile(targets, /*features=*/false));
  RETURN_IF_ERROR(CheckShardPairShapes(features, pair.features.dtype,
                                       pair.features.shape, targets,
                                       pair.targets.dtype, pair.targets.shape));
  pair.rows = pair.features.shape[0];
  return pair;
}

}  // namespace trainyard
