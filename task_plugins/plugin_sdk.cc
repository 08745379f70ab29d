#include "task_plugins/plugin_sdk.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/file_util.h"

namespace trainyard {
namespace plugin {

void SetError(TrainyardError* err, const std::string& message) {
  if (err == nullptr) return;
  std::snprintf(err->message, sizeof(err->message), "%s", message.c_str());
}

absl::StatusOr<nlohmann::json> ParseConfig(
    const char* text, const std::set<std::string>& allowed) {
  if (text == nullptr) return absl::InvalidArgumentError("task.config is NULL");
  nlohmann::json j = nlohmann::json::parse(text, nullptr,
                                           /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.config is not valid JSON: ", text));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.config must be a JSON object, got ", text));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (allowed.count(it.key()) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("task.config: unknown key \"", it.key(),
                       "\" (allowed: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return j;
}

absl::StatusOr<double> GetNumber(const nlohmann::json& config,
                                 const std::string& key, double fallback) {
  auto it = config.find(key);
  if (it == config.end()) return fallback;
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task.config.", key, ": must be a number, got ", it->dump()));
  }
  const double v = it->get<double>();
  if (!std::isfinite(v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.config.", key, ": must be finite"));
  }
  return v;
}

absl::StatusOr<int64_t> GetInt(const nlohmann::json& config,
                               const std::string& key, int64_t fallback) {
  auto it = config.find(key);
  if (it == config.end()) return fallback;
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task.config.", key, ": must be an integer, got ", it->dump()));
  }
  return it->get<int64_t>();
}

absl::StatusOr<std::string> GetString(const nlohmann::json& config,
                                      const std::string& key,
                                      const std::string& fallback) {
  auto it = config.find(key);
  if (it == config.end()) return fallback;
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task.config.", key, ": must be a string, got ", it->dump()));
  }
  return it->get<std::string>();
}

absl::StatusOr<std::string> ResolveDataPath(const CreateContext& ctx,
                                            const std::string& key,
                                            const std::string& path,
                                            const std::string& base_dir) {
  const std::string field = absl::StrCat("task.config.", key, ": ");
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, "empty path"));
  }
  auto join = [](const std::string& base, const std::string& p) {
    if (p[0] == '/' || base.empty()) return p;
    return absl::StrCat(base, "/", p);
  };
  if (ctx.data_dir.empty()) return join(base_dir, path);

  absl::StatusOr<std::string> root =
      ResolveSymlinks(CleanAbsolutePath(ctx.data_dir));
  if (!root.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data folder ", ctx.data_dir, ": ", root.status().message()));
  }
  const std::string base = base_dir.empty() ? *root : join(*root, base_dir);
  const std::string joined = join(base, path);
  absl::StatusOr<std::string> real = ResolveSymlinks(CleanAbsolutePath(joined));
  const bool inside = real.ok() && PathIsInside(*real, *root);
  if (inside) return *real;
  if (!real.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, "\"", path, "\" cannot be shown to stay inside the data folder ",
        *root, ": ", real.status().message()));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, "\"", path, "\" resolves to \"", *real,
                   "\", outside the data folder ", *root,
                   ": file paths in task.config must stay inside it"));
}

std::string ShapeString(const TrainyardTensor& t) {
  std::vector<int64_t> dims;
  for (int i = 0; i < t.ndim && i < TRAINYARD_MAX_DIMS; ++i) {
    dims.push_back(t.shape[i]);
  }
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

std::string DTypeString(int32_t dtype) {
  switch (dtype) {
    case TRAINYARD_FLOAT32:
      return "float32";
    case TRAINYARD_BFLOAT16:
      return "bfloat16";
    case TRAINYARD_INT32:
      return "int32";
    case TRAINYARD_INT64:
      return "int64";
  }
  return absl::StrCat("dtype#", dtype);
}

int64_t NumElements(const TrainyardTensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

absl::StatusOr<const TrainyardTensor*> FindTensor(
    const TrainyardTensor* tensors, int32_t n, const std::string& name) {
  std::vector<std::string> names;
  for (int32_t i = 0; i < n; ++i) {
    if (name == tensors[i].name) return &tensors[i];
    names.push_back(absl::StrCat("\"", tensors[i].name, "\""));
  }
  return absl::NotFoundError(absl::StrCat("no tensor \"", name, "\" (have ",
                                          absl::StrJoin(names, ", "), ")"));
}

bool IsLabelTensor(const TrainyardTensor& t) {
  return t.ndim == 1 &&
         (t.dtype == TRAINYARD_INT32 || t.dtype == TRAINYARD_INT64);
}

int64_t LabelAt(const TrainyardTensor& t, int64_t i) {
  if (t.dtype == TRAINYARD_INT32) return static_cast<const int32_t*>(t.data)[i];
  return static_cast<const int64_t*>(t.data)[i];
}

absl::StatusOr<void*> AddTensor(TrainyardSink* sink, const std::string& name,
                                int32_t dtype,
                                const std::vector<int64_t>& shape) {
  void* p = sink->add_tensor(sink->ctx, name.c_str(), dtype,
                             static_cast<int32_t>(shape.size()), shape.data());
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host refused tensor \"", name, "\" ", DTypeString(dtype),
                     " [", absl::StrJoin(shape, ", "), "]"));
  }
  return p;
}

absl::Status AddFloat32Copy(TrainyardSink* sink, const std::string& name,
                            const TrainyardTensor& t) {
  absl::StatusOr<void*> p =
      AddTensor(sink, name, TRAINYARD_FLOAT32, {t.shape[0], t.shape[1]});
  if (!p.ok()) return p.status();
  const int64_t n = NumElements(t);
  if (n > 0) std::memcpy(*p, t.data, n * sizeof(float));
  return absl::OkStatus();
}

absl::StatusOr<const TrainyardTensor*> CopyFeaturesToInputs(
    const TrainyardBatch& batch, TrainyardSink* out) {
  absl::StatusOr<const TrainyardTensor*> f =
      FindTensor(batch.tensors, batch.num_tensors, "features");
  if (!f.ok()) return f.status();
  const TrainyardTensor& t = **f;
  if (t.dtype != TRAINYARD_FLOAT32 || t.ndim != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"features\" must be float32 [B, D], got ",
                     DTypeString(t.dtype), " ", ShapeString(t)));
  }
  absl::Status s = AddFloat32Copy(out, "inputs", t);
  if (!s.ok()) return s;
  return &t;
}

}  // namespace plugin
}  // namespace trainyard
