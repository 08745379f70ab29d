#include "engine/output_shards.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <system_error>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/file_util.h"
#include "core/host_info.h"
#include "core/npy.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr char kFormat[] = "trainyard-outputs-v1";
constexpr char kManifest[] = "manifest.json";
constexpr char kShardPrefix[] = "shard-";
constexpr char kNpy[] = ".npy";
// Temp entries: ".shard-00003.tmp-<pid>-<random>-<host>/" (a shard being
// written) and ".manifest.json.tmp-<pid>-<random>-<host>" (Open's manifest
// before it is linked into place).
constexpr char kTempTag[] = ".tmp-";
// The spec field users set; Open's refusals start with it.
constexpr char kField[] = "inference.output_dir: ";

std::string ShardName(int64_t shard) {
  return absl::StrFormat("%s%05d", kShardPrefix, shard);
}

// Parses a canonical "shard-<5+ digits>" name.
bool ParseShardName(absl::string_view name, int64_t* shard) {
  if (!absl::ConsumePrefix(&name, kShardPrefix) || name.empty() ||
      !std::all_of(name.begin(), name.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  return absl::SimpleAtoi(name, shard) &&
         ShardName(*shard) == absl::StrCat(kShardPrefix, name);
}

// A unique temp name for `final_name` written by this process.
std::string TempName(absl::string_view final_name) {
  absl::BitGen gen;
  return absl::StrFormat(".%s%s%d-%016x-%s", final_name, kTempTag, ::getpid(),
                         absl::Uniform<uint64_t>(gen), Hostname());
}

bool IsTempName(absl::string_view name) {
  return (absl::StartsWith(name, ".shard-") ||
          absl::StartsWith(name, ".manifest.json")) &&
         absl::StrContains(name, kTempTag);
}

// Whether the temp entry `name` may belong to a writer still at work: one
// named for this host whose process is running. Entries of other hosts
// cannot be told apart from stale ones, so they count as at work.
bool TempMayBeInUse(absl::string_view name) {
  absl::string_view rest =
      name.substr(name.find(kTempTag) + std::strlen(kTempTag));
  const size_t dash = rest.find('-');
  int pid = 0;
  if (dash == absl::string_view::npos ||
      !absl::SimpleAtoi(rest.substr(0, dash), &pid) || pid <= 0) {
    return false;
  }
  rest.remove_prefix(dash + 1);
  const size_t host_at = rest.find('-');
  if (host_at == absl::string_view::npos) return false;
  // WriteFileAtomically's own temp beside a manifest temp adds ".tmp.*".
  const absl::string_view host = rest.substr(host_at + 1);
  const std::string here = Hostname();
  if (host != here && !absl::StartsWith(host, here + ".tmp.")) return true;
  return ::kill(pid, 0) == 0 || errno == EPERM;
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::InternalError(
        absl::StrCat(path, ": cannot delete: ", ec.message()));
  }
  return absl::OkStatus();
}

// Removes the temp entries of `dir` that no writer uses any more; with
// `all_shard_temps`, every shard temp folder (no shard is being written).
absl::Status RemoveStaleTemps(const std::string& dir, bool all_shard_temps) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(dir));
  for (const std::string& name : names) {
    if (!IsTempName(name)) continue;
    const bool stale = (all_shard_temps && absl::StartsWith(name, ".shard-")) ||
                       !TempMayBeInUse(name);
    if (stale) RETURN_IF_ERROR(RemoveTree(JoinPath(dir, name)));
  }
  return absl::OkStatus();
}

absl::Status Refuse(const OutputJob& job, absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat(kField, job.dir, " ", why));
}

absl::StatusOr<json> ParseObject(const std::string& text,
                                 absl::string_view what) {
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output job: ", what,
                     " must be a JSON object, got: ", text.substr(0, 200)));
  }
  return parsed;
}

absl::Status ValidateJob(const OutputJob& job) {
  std::string bad;
  if (job.dir.empty() || job.dir[0] != '/') {
    bad = absl::StrCat("dir must be an absolute path, got \"", job.dir, "\"");
  } else if (job.rows < 0) {
    bad = absl::StrCat("rows must be >= 0, got ", job.rows);
  } else if (job.shard_rows < 1) {
    bad = absl::StrCat("shard_rows must be >= 1, got ", job.shard_rows);
  } else if (job.job_digest.empty()) {
    bad = "job_digest must not be empty";
  }
  if (!bad.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("output job: ", bad));
  }
  RETURN_IF_ERROR(ParseObject(job.model_json, "model_json").status());
  return ParseObject(job.spec_json, "spec_json").status();
}

// The manifest's fields up to "spec"; Finish appends the rest.
json BaseManifest(const OutputJob& job, bool complete, int64_t num_shards) {
  json m = json::object();
  m["format"] = kFormat;
  m["complete"] = complete;
  m["job_digest"] = job.job_digest;
  m["rows"] = job.rows;
  m["shard_rows"] = job.shard_rows;
  m["num_shards"] = num_shards;
  m["model"] = json::parse(job.model_json);  // validated by ValidateJob
  m["spec"] = json::parse(job.spec_json);
  return m;
}

std::string ManifestText(const json& m) {
  return m.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

// Whether the manifest `text` is an earlier run of `job` (OK) or not
// (FailedPrecondition saying why).
absl::Status CheckManifest(const OutputJob& job, const std::string& text) {
  json m = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto field = [&m](const char* key) -> const json* {
    auto it = m.find(key);
    return it == m.end() ? nullptr : &*it;
  };
  if (m.is_discarded() || !m.is_object() || field("format") == nullptr ||
      *field("format") != kFormat) {
    return Refuse(job, absl::StrCat("exists and is not an earlier run of this "
                                    "job (its manifest.json is not ",
                                    kFormat, ")"));
  }
  const json* digest = field("job_digest");
  if (digest == nullptr || !digest->is_string() || *digest != job.job_digest) {
    const std::string theirs = digest == nullptr ? std::string("none")
                               : digest->is_string()
                                   ? digest->get<std::string>()
                                   : digest->dump();
    return Refuse(job,
                  absl::StrCat("holds the outputs of another job (job "
                               "digest ",
                               theirs, ", this job ", job.job_digest, ")"));
  }
  const json* rows = field("rows");
  const json* shard_rows = field("shard_rows");
  if (rows == nullptr || shard_rows == nullptr || *rows != job.rows ||
      *shard_rows != job.shard_rows) {
    return Refuse(
        job,
        absl::StrCat("holds outputs of this job cut as rows ",
                     rows == nullptr ? "none" : rows->dump(), ", shard_rows ",
                     shard_rows == nullptr ? "none" : shard_rows->dump(),
                     "; this run has rows ", job.rows, ", shard_rows ",
                     job.shard_rows));
  }
  return absl::OkStatus();
}

// Creates manifest.json only if there is none: written whole under a temp
// name, then hard-linked into place (link fails if the name exists).
// AlreadyExists when another process created it first.
absl::Status CreateManifest(const OutputJob& job, int64_t num_shards) {
  const std::string tmp = JoinPath(job.dir, TempName(kManifest));
  const std::string path = JoinPath(job.dir, kManifest);
  RETURN_IF_ERROR(WriteFileAtomically(
      tmp, ManifestText(BaseManifest(job, false, num_shards))));
  const int rc = ::link(tmp.c_str(), path.c_str());
  const int err = errno;
  ::unlink(tmp.c_str());
  if (rc != 0 && err == EEXIST) {
    return absl::AlreadyExistsError(absl::StrCat(path, ": exists"));
  }
  if (rc != 0) {
    return absl::InternalError(absl::StrCat(path, ": cannot link from ", tmp,
                                            ": ", std::strerror(err)));
  }
  return SyncDirectory(job.dir);
}

// Makes job.dir this job's output folder (see Open): resumes or creates the
// manifest. Touches nothing in a folder it refuses.
absl::Status ClaimFolder(const OutputJob& job, int64_t num_shards) {
  RETURN_IF_ERROR(CreateDirectories(job.dir));
  const std::string path = JoinPath(job.dir, kManifest);
  // Twice at most: a manifest created by another process between our
  // listing and our link is read on the second round.
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<std::string> text = ReadFileToString(path);
    if (text.ok()) return CheckManifest(job, *text);
    if (!absl::IsNotFound(text.status())) return text.status();
    ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(job.dir));
    // A manifest that appeared since the read above was linked by another
    // process of this job meanwhile: read it on the next round.
    if (std::find(names.begin(), names.end(), kManifest) != names.end()) {
      continue;
    }
    for (const std::string& name : names) {
      if (!IsTempName(name)) {
        return Refuse(job, absl::StrCat("exists and is not an earlier run of "
                                        "this job (it holds \"",
                                        name, "\")"));
      }
    }
    absl::Status created = CreateManifest(job, num_shards);
    if (!absl::IsAlreadyExists(created)) return created;
  }
  return absl::InternalError(
      absl::StrCat(path, ": created and gone again while opening"));
}

// The shards of `dir` that are on disk (complete, as they appear only
// whole).
absl::StatusOr<absl::flat_hash_set<int64_t>> ShardsOnDisk(
    const std::string& dir, int64_t num_shards) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(dir));
  absl::flat_hash_set<int64_t> done;
  for (const std::string& name : names) {
    int64_t shard = 0;
    std::error_code ec;
    if (ParseShardName(name, &shard) && shard < num_shards &&
        fs::is_directory(JoinPath(dir, name), ec)) {
      done.insert(shard);
    }
  }
  return done;
}

// Whether .npy files hold `dtype` (core/npy.h reads and writes these).
bool NpyDType(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kInt32 ||
         dtype == DType::kInt64;
}

// The numpy dtype of an NpyDType: "<f4", "<i4" or "<i8".
std::string NpyDescr(DType dtype) {
  return absl::StrCat("<", dtype == DType::kFloat32 ? "f" : "i",
                      DTypeSize(dtype));
}

// An output name is a file name: [A-Za-z0-9_.-]+, not starting with '.'.
bool SafeName(absl::string_view name) {
  return !name.empty() && name[0] != '.' &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
         });
}

// "float32 [n, 10]" for an output with the given trailing dims.
std::string Describe(DType dtype, const Shape& trailing) {
  std::string dims = "n";
  for (int64_t d : trailing) absl::StrAppend(&dims, ", ", d);
  return absl::StrCat(DTypeName(dtype), " [", dims, "]");
}

// The row count n of `outputs` (dim 0 of each); InvalidArgument for empty
// outputs, bad names, non-host tensors, unsupported dtypes, scalars or
// disagreeing dim 0.
absl::StatusOr<int64_t> RowCount(const std::string& dir,
                                 const NamedTensors& outputs) {
  auto bad = [&dir](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("inference outputs in ", dir, ": ", why));
  };
  if (outputs.empty()) return bad("no outputs given");
  absl::flat_hash_set<std::string> seen;
  for (const auto& [name, t] : outputs) {
    if (!SafeName(name)) {
      return bad(absl::StrCat("output name \"", name,
                              "\" is not a safe file name ([A-Za-z0-9_.-], "
                              "not starting with '.')"));
    }
    if (!seen.insert(name).second) {
      return bad(absl::StrCat("output \"", name, "\" is given twice"));
    }
    if (!t.device().is_cpu() || !NpyDType(t.dtype()) || t.ndim() < 1) {
      return bad(absl::StrCat("output \"", name, "\" is ", DTypeName(t.dtype()),
                              " ", ShapeToString(t.shape()), " on ",
                              t.device().ToString(),
                              "; expected a host float32, int32 or int64 "
                              "tensor with a row dimension"));
    }
    if (t.dim(0) != outputs[0].second.dim(0)) {
      return bad(absl::StrCat("output \"", name, "\" has ", t.dim(0),
                              " rows, \"", outputs[0].first, "\" has ",
                              outputs[0].second.dim(0)));
    }
  }
  return outputs[0].second.dim(0);
}

Shape Trailing(const Shape& shape) {
  return Shape(shape.begin() + 1, shape.end());
}

// The .npy headers in the folder of `shard` (rows [begin, end)), by output
// name. FailedPrecondition when the folder is missing, holds no .npy file,
// or one whose dim 0 is not the shard's row count.
absl::StatusOr<std::map<std::string, NpyHeader>> ReadShardHeaders(
    const OutputJob& job, int64_t shard, int64_t num_shards,
    std::pair<int64_t, int64_t> rows) {
  const std::string dir = JoinPath(job.dir, ShardName(shard));
  const std::string rows_text =
      absl::StrCat("rows [", rows.first, ", ", rows.second, ")");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " (", rows_text,
                     ") is missing: not written yet, or its write "
                     "failed; all ",
                     num_shards, " shards must be written before Finish"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(dir));
  std::map<std::string, NpyHeader> headers;
  for (const std::string& name : names) {
    if (!absl::EndsWith(name, kNpy) || absl::StartsWith(name, ".")) continue;
    const std::string path = JoinPath(dir, name);
    ASSIGN_OR_RETURN(NpyHeader header, ReadNpyHeader(path));
    if (header.shape.empty() || header.shape[0] != rows.second - rows.first) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": has shape ", ShapeToString(header.shape),
                       ", but shard ", shard, " holds ", rows_text));
    }
    headers[name.substr(0, name.size() - std::strlen(kNpy))] = header;
  }
  if (headers.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": holds no .npy file"));
  }
  return headers;
}

// Checks that a shard's headers `got` (in `dir`) name the same outputs as
// shard 0's `want`, each with the same dtype and trailing dims.
absl::Status CheckSameOutputs(const std::string& dir,
                              const std::map<std::string, NpyHeader>& got,
                              const std::map<std::string, NpyHeader>& want) {
  auto names = [](const std::map<std::string, NpyHeader>& headers) {
    std::vector<std::string> out;
    for (const auto& entry : headers) out.push_back(entry.first);
    return absl::StrCat("{", absl::StrJoin(out, ", "), "}");
  };
  if (names(got) != names(want)) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": holds outputs ", names(got), ", ", ShardName(0),
                     " holds ", names(want)));
  }
  for (const auto& [name, header] : got) {
    const NpyHeader& first = want.at(name);
    if (header.dtype != first.dtype ||
        Trailing(header.shape) != Trailing(first.shape)) {
      return absl::FailedPreconditionError(absl::StrCat(
          JoinPath(dir, name + kNpy), ": ",
          Describe(header.dtype, Trailing(header.shape)), " differs from ",
          ShardName(0), "'s ", Describe(first.dtype, Trailing(first.shape))));
    }
  }
  return absl::OkStatus();
}

}  // namespace

OutputShards::OutputShards(OutputJob job, absl::flat_hash_set<int64_t> done)
    : job_(std::move(job)),
      num_shards_((job_.rows + job_.shard_rows - 1) / job_.shard_rows),
      done_(std::move(done)) {}

absl::StatusOr<std::vector<bool>> CompleteShards(const std::string& dir,
                                                 int64_t num_shards) {
  std::vector<bool> done(std::max<int64_t>(0, num_shards), false);
  absl::StatusOr<std::vector<std::string>> names = ListFolder(dir);
  if (absl::IsNotFound(names.status())) return done;
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    int64_t shard = 0;
    if (ParseShardName(name, &shard) && shard >= 0 && shard < num_shards) {
      done[shard] = true;
    }
  }
  return done;
}

absl::StatusOr<std::unique_ptr<OutputShards>> OutputShards::Open(
    const OutputJob& job) {
  RETURN_IF_ERROR(ValidateJob(job));
  const int64_t num_shards = (job.rows + job.shard_rows - 1) / job.shard_rows;
  RETURN_IF_ERROR(ClaimFolder(job, num_shards));
  RETURN_IF_ERROR(RemoveStaleTemps(job.dir, /*all_shard_temps=*/false));
  ASSIGN_OR_RETURN(absl::flat_hash_set<int64_t> done,
                   ShardsOnDisk(job.dir, num_shards));
  return std::unique_ptr<OutputShards>(new OutputShards(job, std::move(done)));
}

std::pair<int64_t, int64_t> OutputShards::ShardRows(int64_t shard) const {
  CHECK_GE(shard, 0);
  CHECK_LT(shard, num_shards_);
  const int64_t begin = shard * job_.shard_rows;
  return {begin, std::min(begin + job_.shard_rows, job_.rows)};
}

bool OutputShards::done(int64_t shard) const {
  absl::MutexLock lock(&mu_);
  return done_.contains(shard);
}

absl::Status OutputShards::CheckOutputs(const NamedTensors& outputs) {
  if (schema_.empty()) {
    for (const auto& [name, t] : outputs) {
      schema_.push_back({name, t.dtype(), Trailing(t.shape())});
    }
    return absl::OkStatus();
  }
  auto names = [](const auto& list, auto get) {
    std::vector<std::string> out;
    for (const auto& e : list) out.push_back(get(e));
    std::sort(out.begin(), out.end());
    return absl::StrCat("{", absl::StrJoin(out, ", "), "}");
  };
  const std::string want =
      names(schema_, [](const Output& o) { return o.name; });
  const std::string got =
      names(outputs, [](const auto& named) { return named.first; });
  if (want != got) {
    return absl::InvalidArgumentError(
        absl::StrCat("inference outputs in ", job_.dir, ": outputs ", got,
                     " differ from earlier rows' ", want));
  }
  for (const auto& [name, t] : outputs) {
    const Output& o =
        *std::find_if(schema_.begin(), schema_.end(),
                      [&](const Output& s) { return s.name == name; });
    if (t.dtype() != o.dtype || Trailing(t.shape()) != o.trailing) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inference outputs in ", job_.dir, ": output \"", name, "\" is ",
          DTypeName(t.dtype()), " ", ShapeToString(t.shape()),
          ", earlier rows had ", Describe(o.dtype, o.trailing)));
    }
  }
  return absl::OkStatus();
}

absl::Status OutputShards::Add(int64_t row, const NamedTensors& outputs) {
  ASSIGN_OR_RETURN(const int64_t n, RowCount(job_.dir, outputs));
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("inference outputs in ",
                                                   job_.dir, ": rows [", row,
                                                   ", ", row + n, ") ", why));
  };
  if (row < 0 || row + n > job_.rows || (n == 0 && row > job_.rows)) {
    return bad(
        absl::StrCat("are out of range: the job has ", job_.rows, " rows"));
  }
  if (n == 0) return absl::OkStatus();
  const int64_t shard = row / job_.shard_rows;
  const auto [begin, end] = ShardRows(shard);
  if (row + n > end) {
    return bad(absl::StrCat("cross the end of shard ", shard, " (rows [", begin,
                            ", ", end, "))"));
  }
  std::unique_ptr<Pending> complete;
  std::vector<Output> schema;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckOutputs(outputs));
    ASSIGN_OR_RETURN(complete, Buffer(shard, row, n, outputs));
    if (complete == nullptr) return absl::OkStatus();
    schema = schema_;
  }
  absl::Status written = WriteShard(shard, *complete, schema);
  if (written.ok()) {
    absl::MutexLock lock(&mu_);
    done_.insert(shard);
  }
  return written;
}

absl::StatusOr<std::unique_ptr<OutputShards::Pending>> OutputShards::Buffer(
    int64_t shard, int64_t row, int64_t n, const NamedTensors& outputs) {
  const auto [begin, end] = ShardRows(shard);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("inference outputs in ", job_.dir, ": rows [", row, ", ",
                     row + n, ") of shard ", shard, " ", why));
  };
  if (done_.contains(shard)) {
    return bad(
        "were given twice: the shard is already complete on disk "
        "(done() is true: skip it)");
  }
  if (closed_.contains(shard)) {
    return bad("were given twice: the shard already has all its rows");
  }
  std::unique_ptr<Pending>& pending = pending_[shard];
  if (pending == nullptr) {
    auto fresh = std::make_unique<Pending>();
    for (const Output& o : schema_) {
      Shape shape = {end - begin};
      shape.insert(shape.end(), o.trailing.begin(), o.trailing.end());
      absl::StatusOr<Tensor> t = Tensor::Create(o.dtype, shape);
      if (!t.ok()) {
        pending_.erase(shard);
        return Prefixed(t.status(), absl::StrCat("output \"", o.name,
                                                 "\" of shard ", shard, ": "));
      }
      fresh->tensors.push_back(*std::move(t));
    }
    fresh->have.assign(end - begin, false);
    pending = std::move(fresh);
  }
  for (int64_t r = row; r < row + n; ++r) {
    if (pending->have[r - begin]) {
      return bad(absl::StrCat("were given twice: row ", r, " is already in"));
    }
  }
  for (size_t i = 0; i < schema_.size(); ++i) {
    const Tensor& src =
        std::find_if(outputs.begin(), outputs.end(), [&](const auto& named) {
          return named.first == schema_[i].name;
        })->second;
    const size_t row_bytes = src.nbytes() / n;
    std::memcpy(static_cast<char*>(pending->tensors[i].raw_data()) +
                    (row - begin) * row_bytes,
                src.raw_data(), src.nbytes());
  }
  std::fill(pending->have.begin() + (row - begin),
            pending->have.begin() + (row - begin + n), true);
  pending->count += n;
  if (pending->count < end - begin) return nullptr;
  std::unique_ptr<Pending> complete = std::move(pending);
  pending_.erase(shard);
  closed_.insert(shard);
  return complete;
}

absl::Status OutputShards::WriteShard(int64_t shard, const Pending& pending,
                                      const std::vector<Output>& schema) const {
  const std::string name = ShardName(shard);
  const std::string final_dir = JoinPath(job_.dir, name);
  const std::string tmp = JoinPath(job_.dir, TempName(name));
  if (::mkdir(tmp.c_str(), 0755) != 0) {
    return absl::InternalError(
        absl::StrCat(tmp, ": cannot create folder: ", std::strerror(errno)));
  }
  absl::Status status;
  for (size_t i = 0; i < schema.size() && status.ok(); ++i) {
    status = WriteNpy(JoinPath(tmp, schema[i].name + kNpy), pending.tensors[i]);
  }
  if (status.ok() && ::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    const int err = errno;
    if (err == EEXIST || err == ENOTEMPTY) {
      status = absl::FailedPreconditionError(
          absl::StrCat(final_dir,
                       ": written by another process meanwhile (each shard "
                       "must be written by one process only)"));
    } else {
      status = absl::InternalError(absl::StrCat(
          final_dir, ": cannot rename from ", tmp, ": ", std::strerror(err)));
    }
  }
  if (!status.ok()) {
    RemoveTree(tmp).IgnoreError();  // best effort: Finish removes leftovers
    return status;
  }
  return SyncDirectory(job_.dir);
}

absl::Status OutputShards::Finish() {
  std::map<std::string, NpyHeader> first;
  json shards = json::array();
  for (int64_t k = 0; k < num_shards_; ++k) {
    const auto [begin, end] = ShardRows(k);
    ASSIGN_OR_RETURN(auto headers,
                     ReadShardHeaders(job_, k, num_shards_, {begin, end}));
    if (k == 0) {
      first = headers;
    } else {
      RETURN_IF_ERROR(
          CheckSameOutputs(JoinPath(job_.dir, ShardName(k)), headers, first));
    }
    json files = json::object();
    for (const auto& entry : headers) {
      files[entry.first] = absl::StrCat(ShardName(k), "/", entry.first, kNpy);
    }
    json entry = json::object();
    entry["index"] = k;
    entry["rows"] = json::array({begin, end});
    entry["files"] = std::move(files);
    shards.push_back(std::move(entry));
  }
  json outputs = json::object();
  for (const auto& [name, header] : first) {
    Shape shape = Trailing(header.shape);
    shape.insert(shape.begin(), job_.rows);
    outputs[name] = {{"dtype", NpyDescr(header.dtype)}, {"shape", shape}};
  }
  RETURN_IF_ERROR(RemoveStaleTemps(job_.dir, /*all_shard_temps=*/true));
  json manifest = BaseManifest(job_, /*complete=*/true, num_shards_);
  manifest["outputs"] = std::move(outputs);
  manifest["shards"] = std::move(shards);
  return WriteFileAtomically(JoinPath(job_.dir, kManifest),
                             ManifestText(manifest));
}

}  // namespace trainyard
