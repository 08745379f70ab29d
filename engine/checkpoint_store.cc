#include "engine/checkpoint_store.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/file_util.h"
#include "core/sha256.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr char kManifest[] = "manifest.json";
constexpr char kFormat[] = "trainyard.checkpoint.v1";
constexpr char kStepPrefix[] = "step_";
constexpr char kStagePrefix[] = "stage_";
constexpr char kStageSuffix[] = ".safetensors";
// Beside each stage file: "<sha256 hex> <size>\n" of its bytes.
constexpr char kDigestSuffix[] = ".sha256";

std::string StageFileName(int stage) {
  return absl::StrCat(kStagePrefix, stage, kStageSuffix);
}

bool Exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

std::string ManifestPath(const std::string& dir, int64_t step) {
  return JoinPath(CheckpointStepDir(dir, step), kManifest);
}

// Parses a canonical "step_<8+ digits>" name; other names are not ours.
bool ParseStepDirName(const std::string& name, int64_t* step) {
  if (!absl::StartsWith(name, kStepPrefix)) return false;
  absl::string_view digits = absl::string_view(name).substr(5);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) {
        return c >= '0' && c <= '9';
      })) {
    return false;
  }
  if (!absl::SimpleAtoi(digits, step)) return false;
  return absl::StrFormat("step_%08d", *step) == name;
}

// Parses "stage_<k>.safetensors".
bool ParseStageFileName(const std::string& name, int* stage) {
  if (!absl::StartsWith(name, kStagePrefix) ||
      !absl::EndsWith(name, kStageSuffix)) {
    return false;
  }
  absl::string_view digits = absl::string_view(name).substr(
      6, name.size() - 6 - std::strlen(kStageSuffix));
  return !digits.empty() && absl::SimpleAtoi(digits, stage) &&
         StageFileName(*stage) == name;
}

// Every step folder in `dir`, ascending.
absl::StatusOr<std::vector<int64_t>> ListStepDirs(const std::string& dir) {
  auto names = ListFolder(dir);
  if (absl::IsNotFound(names.status())) return std::vector<int64_t>{};
  if (!names.ok()) return names.status();
  std::vector<int64_t> steps;
  for (const std::string& name : *names) {
    int64_t step;
    std::error_code ec;
    if (ParseStepDirName(name, &step) &&
        fs::is_directory(JoinPath(dir, name), ec)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::Status RemoveIfExists(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::InternalError(
        absl::StrCat(path, ": cannot delete: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status RemoveStepDir(const std::string& dir, int64_t step) {
  const std::string step_dir = CheckpointStepDir(dir, step);
  // Manifest first, made durable, so a crash below leaves an incomplete
  // step rather than a "complete" one with missing files.
  RETURN_IF_ERROR(RemoveIfExists(JoinPath(step_dir, kManifest)));
  RETURN_IF_ERROR(SyncDirectory(step_dir));
  std::error_code ec;
  fs::remove_all(step_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat(step_dir, ": cannot delete: ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status DataLoss(const std::string& path, absl::string_view why) {
  return absl::DataLossError(absl::StrCat(path, ": ", why));
}

}  // namespace

std::string CheckpointStepDir(const std::string& dir, int64_t step) {
  return JoinPath(dir, absl::StrFormat("step_%08d", step));
}

std::string CheckpointStagePath(const std::string& dir, int64_t step,
                                int stage) {
  return JoinPath(CheckpointStepDir(dir, step), StageFileName(stage));
}

absl::StatusOr<std::string> WriteStageFile(const std::string& dir, int64_t step,
                                           int stage,
                                           const SafetensorsFile& contents) {
  const std::string path = CheckpointStagePath(dir, step, stage);
  if (step < 0 || stage < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint in ", dir, ": step (", step, ") and stage (",
                     stage, ") must be >= 0"));
  }
  absl::Status valid = ValidateSafetensors(contents);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot write: ", valid.message()));
  }
  const std::string step_dir = CheckpointStepDir(dir, step);
  RETURN_IF_ERROR(CreateDirectories(step_dir));
  RETURN_IF_ERROR(RemoveIfExists(JoinPath(step_dir, kManifest)));
  // The digest file goes first and comes back last, so it never describes
  // other bytes than the stage file beside it.
  const std::string digest_path = path + kDigestSuffix;
  RETURN_IF_ERROR(RemoveIfExists(digest_path));
  const std::string bytes = SerializeSafetensors(contents);
  RETURN_IF_ERROR(WriteFileAtomically(path, bytes));
  std::string sha = Sha256Hex(bytes);
  RETURN_IF_ERROR(WriteFileAtomically(
      digest_path, absl::StrCat(sha, " ", bytes.size(), "\n")));
  return sha;
}

namespace {

// The size and SHA-256 that WriteStageFile recorded beside `path`, if its
// digest file is there and agrees with the file's size.
std::optional<std::pair<int64_t, std::string>> RecordedDigest(
    const std::string& path) {
  auto text = ReadFileToString(path + kDigestSuffix);
  if (!text.ok()) return std::nullopt;
  std::vector<std::string> parts =
      absl::StrSplit(absl::StripTrailingAsciiWhitespace(*text), ' ');
  int64_t size = 0;
  if (parts.size() != 2 || parts[0].size() != 64 ||
      !absl::SimpleAtoi(parts[1], &size)) {
    return std::nullopt;
  }
  auto actual = FileSize(path);
  if (!actual.ok() || *actual != size) return std::nullopt;
  return std::make_pair(size, parts[0]);
}

// Removes the stage files (and their digests) numbered `num_stages` or more
// from `step_dir`, whose entries are `names`. Such a file in a folder that
// is being committed is a leftover of an earlier, uncommitted attempt at
// this step with more stages (a crash before its manifest, then a resume
// with fewer stages): only the manifest makes a checkpoint, so it is
// removed rather than refused.
absl::Status RemoveLeftoverStageFiles(const std::string& step_dir,
                                      const std::vector<std::string>& names,
                                      int num_stages) {
  for (const std::string& name : names) {
    int k;
    const std::string stage_name =
        absl::EndsWith(name, kDigestSuffix)
            ? name.substr(0, name.size() - std::strlen(kDigestSuffix))
            : name;
    if (ParseStageFileName(stage_name, &k) && k >= num_stages) {
      const std::string path = JoinPath(step_dir, name);
      if (std::remove(path.c_str()) != 0) {
        return absl::InternalError(absl::StrCat(
            path, ": leftover stage file (the checkpoint has ", num_stages,
            " stages) could not be removed: ", std::strerror(errno)));
      }
    }
  }
  return absl::OkStatus();
}

// One entry of the manifest's "stages"; `size` keeps the JSON number type
// it was made with.
json StageManifestEntry(int stage, json size, const std::string& sha256) {
  json entry = json::object();
  entry["stage"] = stage;
  entry["file"] = StageFileName(stage);
  entry["size"] = std::move(size);
  entry["sha256"] = sha256;
  return entry;
}

// The manifest entry of stage `stage` of checkpoint `step`: from the digest
// WriteStageFile recorded, else by reading and checking the stage file.
absl::StatusOr<json> DescribeStageFile(const std::string& dir, int64_t step,
                                       int stage) {
  const std::string path = CheckpointStagePath(dir, step, stage);
  if (auto recorded = RecordedDigest(path)) {
    // Written by WriteStageFile from a validated SafetensorsFile, which
    // hashed the bytes as it wrote them: no need to read them back.
    return StageManifestEntry(stage, recorded->first, recorded->second);
  }
  auto bytes = ReadFileToString(path);
  if (absl::IsNotFound(bytes.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat(path,
                     ": missing; every stage must write its file before the "
                     "checkpoint is committed"));
  }
  RETURN_IF_ERROR(bytes.status());
  auto parsed = ParseSafetensors(*bytes, path);
  if (!parsed.ok()) return absl::DataLossError(parsed.status().message());
  return StageManifestEntry(stage, bytes->size(), Sha256Hex(*bytes));
}

}  // namespace

absl::Status CommitCheckpoint(const std::string& dir, int64_t step,
                              int num_stages,
                              const std::string& job_metadata_json) {
  const std::string step_dir = CheckpointStepDir(dir, step);
  if (step < 0 || num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", step_dir, ": step (", step,
                     ") must be >= 0 and num_stages (", num_stages, ") >= 1"));
  }
  auto names = ListFolder(step_dir);
  if (absl::IsNotFound(names.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", step_dir,
                     ": folder does not exist; no stage file was written"));
  }
  RETURN_IF_ERROR(names.status());
  RETURN_IF_ERROR(RemoveLeftoverStageFiles(step_dir, *names, num_stages));
  json manifest = json::object();
  manifest["format"] = kFormat;
  manifest["step"] = step;
  manifest["num_stages"] = num_stages;
  json stages = json::array();
  for (int k = 0; k < num_stages; ++k) {
    ASSIGN_OR_RETURN(json entry, DescribeStageFile(dir, step, k));
    stages.push_back(std::move(entry));
  }
  manifest["stages"] = std::move(stages);
  manifest["job_metadata"] = job_metadata_json;
  const std::string text =
      manifest.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  return WriteFileAtomically(JoinPath(step_dir, kManifest), text);
}

namespace {

// The field `key` of `obj` if it is there and of `type` (number_unsigned
// meaning any non-negative integer), else null.
const json* FindField(const json& obj, const char* key, json::value_t type) {
  auto it = obj.find(key);
  if (it == obj.end()) return nullptr;
  if (type == json::value_t::number_unsigned ? !it->is_number_unsigned()
                                             : it->type() != type) {
    return nullptr;
  }
  return &*it;
}

// Reads the manifest's "stages" array `stages_j`, one entry per stage,
// into `stages`.
absl::Status ReadManifestStages(
    const std::string& path, const json& stages_j, int num_stages,
    std::vector<CheckpointManifest::StageEntry>* stages) {
  for (int k = 0; k < num_stages; ++k) {
    const json& e = stages_j[k];
    const json* file =
        e.is_object() ? FindField(e, "file", json::value_t::string) : nullptr;
    const json* size =
        e.is_object() ? FindField(e, "size", json::value_t::number_unsigned)
                      : nullptr;
    const json* sha =
        e.is_object() ? FindField(e, "sha256", json::value_t::string) : nullptr;
    if (!file || !size || !sha ||
        file->get<std::string>() != StageFileName(k)) {
      return DataLoss(
          path,
          absl::StrCat("stages[", k, "] must be {\"file\": \"",
                       StageFileName(k), "\", \"size\": N, \"sha256\": hex}"));
    }
    stages->push_back({file->get<std::string>(), size->get<int64_t>(),
                       sha->get<std::string>()});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(
    const std::string& dir, int64_t step) {
  const std::string path = ManifestPath(dir, step);
  auto text = ReadFileToString(path);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", CheckpointStepDir(dir, step),
                     " is not complete: ", path, " does not exist"));
  }
  RETURN_IF_ERROR(text.status());
  json m = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) {
    return DataLoss(path, "not a valid JSON object");
  }
  const json* format = FindField(m, "format", json::value_t::string);
  if (format == nullptr || format->get<std::string>() != kFormat) {
    return DataLoss(path, absl::StrCat("\"format\" must be \"", kFormat, "\""));
  }
  const json* step_j = FindField(m, "step", json::value_t::number_unsigned);
  const json* n_j = FindField(m, "num_stages", json::value_t::number_unsigned);
  const json* stages_j = FindField(m, "stages", json::value_t::array);
  const json* meta_j = FindField(m, "job_metadata", json::value_t::string);
  if (!step_j || !n_j || !stages_j || !meta_j) {
    return DataLoss(path,
                    "needs \"step\", \"num_stages\" (non-negative integers), "
                    "\"stages\" (array) and \"job_metadata\" (string)");
  }
  CheckpointManifest out;
  out.step = step_j->get<int64_t>();
  out.num_stages = n_j->get<int>();
  out.job_metadata_json = meta_j->get<std::string>();
  if (out.step != step) {
    return DataLoss(path,
                    absl::StrCat("says step ", out.step,
                                 " but lies in the folder of step ", step));
  }
  if (out.num_stages < 1 ||
      stages_j->size() != static_cast<size_t>(out.num_stages)) {
    return DataLoss(path, absl::StrCat("num_stages is ", out.num_stages,
                                       " but \"stages\" has ", stages_j->size(),
                                       " entries"));
  }
  RETURN_IF_ERROR(
      ReadManifestStages(path, *stages_j, out.num_stages, &out.stages));
  return out;
}

absl::StatusOr<std::vector<int64_t>> ListCompleteCheckpoints(
    const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListStepDirs(dir));
  std::vector<int64_t> complete;
  for (int64_t step : steps) {
    if (ReadCheckpointManifest(dir, step).ok()) complete.push_back(step);
  }
  return complete;
}

absl::StatusOr<std::optional<int64_t>> LatestCheckpoint(
    const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCompleteCheckpoints(dir));
  if (steps.empty()) return std::optional<int64_t>();
  return std::optional<int64_t>(steps.back());
}

absl::StatusOr<SafetensorsFile> ReadStageFile(const std::string& dir,
                                              int64_t step, int stage,
                                              int num_stages) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest,
                   ReadCheckpointManifest(dir, step));
  const std::string path = CheckpointStagePath(dir, step, stage);
  if (manifest.num_stages != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        ManifestPath(dir, step), ": checkpoint has ", manifest.num_stages,
        " pipeline stages but this job has ", num_stages,
        " (resuming with a different number of stages is not supported)"));
  }
  if (stage < 0 || stage >= num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": stage ", stage, " out of range [0, ", num_stages, ")"));
  }
  const CheckpointManifest::StageEntry& want = manifest.stages[stage];
  auto bytes = ReadFileToString(path);
  if (absl::IsNotFound(bytes.status())) {
    return absl::NotFoundError(
        absl::StrCat(path, ": missing, but listed in ", kManifest));
  }
  RETURN_IF_ERROR(bytes.status());
  if (static_cast<int64_t>(bytes->size()) != want.size) {
    return DataLoss(path,
                    absl::StrCat("has ", bytes->size(),
                                 " bytes but the manifest says ", want.size,
                                 bytes->size() < static_cast<size_t>(want.size)
                                     ? " (truncated)"
                                     : ""));
  }
  const std::string sha = Sha256Hex(*bytes);
  if (sha != want.sha256) {
    return DataLoss(path, absl::StrCat("checksum mismatch: sha256 is ", sha,
                                       ", the manifest says ", want.sha256,
                                       " (file corrupted or replaced)"));
  }
  auto file = ParseSafetensors(*bytes, path);
  if (!file.ok()) return absl::DataLossError(file.status().message());
  return file;
}

absl::Status VerifyCheckpoint(const std::string& dir, int64_t step) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest,
                   ReadCheckpointManifest(dir, step));
  for (int k = 0; k < manifest.num_stages; ++k) {
    RETURN_IF_ERROR(ReadStageFile(dir, step, k, manifest.num_stages).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> NewestCommittedStep(
    const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListStepDirs(dir));
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (Exists(ManifestPath(dir, *it))) return std::optional<int64_t>(*it);
  }
  return std::optional<int64_t>();
}

namespace {

// Verification failures that mean the checkpoint itself is bad (set it
// aside); anything else (EIO, EACCES, too many open files) is passed up
// rather than taken as a reason to move a good checkpoint away.
bool MeansBadCheckpoint(const absl::Status& st) {
  return absl::IsDataLoss(st) || absl::IsNotFound(st) ||
         absl::IsInvalidArgument(st);
}

}  // namespace

absl::StatusOr<VerifiedCheckpoint> LatestVerifiedCheckpoint(
    const std::string& dir, int64_t max_step) {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListStepDirs(dir));
  VerifiedCheckpoint out;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const int64_t step = *it;
    if (step > max_step) continue;
    if (!Exists(ManifestPath(dir, step))) continue;  // never committed
    absl::Status verified = VerifyCheckpoint(dir, step);
    if (verified.ok()) {
      out.step = step;
      return out;
    }
    if (absl::IsNotFound(verified) && !Exists(CheckpointStepDir(dir, step))) {
      continue;  // another process set it aside while we read it
    }
    if (!MeansBadCheckpoint(verified)) {
      return absl::Status(
          verified.code(),
          absl::StrCat("verifying checkpoint ", CheckpointStepDir(dir, step),
                       ": ", verified.message()));
    }
    const std::string from = CheckpointStepDir(dir, step);
    const std::string to = absl::StrCat(
        from, ".bad-",
        absl::FormatTime("%Y%m%dT%H%M%S", absl::Now(), absl::UTCTimeZone()),
        "-", ::getpid());
    std::string where;
    if (::rename(from.c_str(), to.c_str()) == 0) {
      RETURN_IF_ERROR(SyncDirectory(dir));
      where = absl::StrCat("moved to ", to);
    } else if (errno == ENOENT) {
      where = "moved aside by another process";
    } else {
      return absl::InternalError(absl::StrCat(
          from, ": cannot set the bad checkpoint aside: ", std::strerror(errno),
          " (it failed verification: ", verified.message(), ")"));
    }
    out.set_aside.push_back(
        absl::StrCat("step ", step, ": ", verified.message(), "; ", where));
  }
  if (!out.set_aside.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no checkpoint in ", dir,
                     " verifies: ", absl::StrJoin(out.set_aside, " | ")));
  }
  return out;
}

absl::Status PruneCheckpoints(const std::string& dir, int keep_last) {
  if (keep_last < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pruning checkpoints in ", dir,
                     ": keep_last must be >= 0, got ", keep_last));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> all, ListStepDirs(dir));
  ASSIGN_OR_RETURN(std::vector<int64_t> complete, ListCompleteCheckpoints(dir));
  if (complete.empty()) return absl::OkStatus();
  const int64_t newest = complete.back();
  std::vector<int64_t> doomed;
  if (keep_last > 0 && complete.size() > static_cast<size_t>(keep_last)) {
    doomed.assign(complete.begin(), complete.end() - keep_last);
  }
  for (int64_t step : all) {
    if (step < newest &&
        !std::binary_search(complete.begin(), complete.end(), step)) {
      doomed.push_back(step);
    }
  }
  for (int64_t step : doomed) {
    RETURN_IF_ERROR(RemoveStepDir(dir, step));
  }
  if (!doomed.empty()) RETURN_IF_ERROR(SyncDirectory(dir));
  return absl::OkStatus();
}

}  // namespace trainyard
