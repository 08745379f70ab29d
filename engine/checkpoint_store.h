// On-disk checkpoints of a pipeline of S stages (layout: docs/
// CHECKPOINT_FORMAT.md):
//
//   <dir>/step_<8-digit step>/stage_<k>.safetensors   one per stage
//   <dir>/step_<8-digit step>/manifest.json           written last
//
// Each stage's owner writes its own file (possibly from another process);
// then one process commits the step by writing manifest.json, which lists
// every stage file's size and SHA-256. A checkpoint is complete iff its
// manifest exists and parses, so a crash at any point leaves the previous
// complete checkpoint as the latest. Every file is written atomically (temp
// file, fsync, rename, fsync of the folder).
//
// The store only knows files; what the tensors and metadata inside a stage
// file mean is the engine's business (documented in the same doc).
//
// Thread safety: free functions without shared state. Writers of different
// stage files of one step may run concurrently; CommitCheckpoint must run
// after all of them finished, and PruneCheckpoints must not race a writer of
// an older step.
#ifndef TRAINYARD_ENGINE_CHECKPOINT_STORE_H_
#define TRAINYARD_ENGINE_CHECKPOINT_STORE_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/safetensors.h"

namespace trainyard {

// "<dir>/step_00000042" (at least 8 digits; more for steps >= 10^8).
std::string CheckpointStepDir(const std::string& dir, int64_t step);
// "<dir>/step_00000042/stage_3.safetensors".
std::string CheckpointStagePath(const std::string& dir, int64_t step,
                                int stage);

struct CheckpointManifest {
  struct StageEntry {
    std::string file;    // "stage_<k>.safetensors", relative to the step folder
    int64_t size = 0;    // bytes
    std::string sha256;  // 64 lowercase hex characters
  };
  int64_t step = 0;
  int num_stages = 0;
  std::vector<StageEntry> stages;  // index = stage
  std::string job_metadata_json;   // verbatim, as given to CommitCheckpoint
};

// Writes stage `stage`'s file of checkpoint `step` atomically, creating the
// folders, and beside it "stage_<k>.safetensors.sha256" with the bytes'
// SHA-256 and size (so the commit need not read them back). If that step was
// already committed its manifest is removed first (the step is incomplete until
// CommitCheckpoint runs again). Returns the file's SHA-256 (hex).
// InvalidArgument for step < 0, stage < 0 or invalid contents (see
// ValidateSafetensors); I/O errors name the path.
absl::StatusOr<std::string> WriteStageFile(const std::string& dir, int64_t step,
                                           int stage,
                                           const SafetensorsFile& contents);

// Commits checkpoint `step`: every stage_<k>.safetensors for k < num_stages
// must exist; a file with a digest written by WriteStageFile (matching its
// size) is taken as recorded, any other must parse as safetensors and is
// hashed. Records their sizes and checksums
// and `job_metadata_json` (any string; the engine stores its job JSON) in
// manifest.json, written atomically. A stage_<k> with k >= num_stages (a
// leftover of an earlier attempt with more stages) is deleted first.
// FailedPrecondition naming the file if a stage file is missing; DataLoss
// naming the file if one without a digest does not parse.
absl::Status CommitCheckpoint(const std::string& dir, int64_t step,
                              int num_stages,
                              const std::string& job_metadata_json);

// Reads and validates <dir>/step_.../manifest.json. NotFound if the step
// has no manifest (it is incomplete or absent); DataLoss naming the file if
// it does not parse or disagrees with its folder's step.
absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(
    const std::string& dir, int64_t step);

// Steps of the complete checkpoints in `dir`, ascending. A missing `dir`
// holds none (empty list, not an error). Entries other than step folders
// are ignored.
absl::StatusOr<std::vector<int64_t>> ListCompleteCheckpoints(
    const std::string& dir);

// The newest step folder that holds a manifest.json at all (whether it
// parses or not): the newest checkpoint that was committed, or nullopt.
absl::StatusOr<std::optional<int64_t>> NewestCommittedStep(
    const std::string& dir);
// The newest complete checkpoint, or nullopt if there is none.
absl::StatusOr<std::optional<int64_t>> LatestCheckpoint(const std::string& dir);

// Checks checkpoint `step` as a resume would read it: the manifest parses
// and every stage file has the manifest's size and SHA-256 and parses.
// Errors as ReadCheckpointManifest / ReadStageFile, naming the file.
absl::Status VerifyCheckpoint(const std::string& dir, int64_t step);

// The checkpoint to resume from, and what was set aside to find it.
struct VerifiedCheckpoint {
  std::optional<int64_t> step;  // nullopt: `dir` holds no checkpoint
  // One line per checkpoint moved aside, newest first:
  // "step 40: <why it failed>; moved to <path>".
  std::vector<std::string> set_aside;
};

// The newest checkpoint in `dir` that verifies (VerifyCheckpoint). Newer
// step folders that have a manifest but fail verification (a truncated or
// altered stage file, an unparsable manifest) are set aside: renamed to
// "step_<N>.bad-<UTC time>-<pid>", never deleted, so that no later resume
// or prune looks at them again. Step folders without a manifest (a write in
// progress, or interrupted before its commit) are left alone. Safe to run
// from several processes at once (a folder another process moved first
// counts as moved). Checkpoints after `max_step` are not looked at (they
// stay as they are). Errors: FailedPrecondition when checkpoints exist but
// none verifies (every reason listed); I/O errors naming the path.
absl::StatusOr<VerifiedCheckpoint> LatestVerifiedCheckpoint(
    const std::string& dir,
    int64_t max_step = std::numeric_limits<int64_t>::max());

// Reads stage `stage` of complete checkpoint `step`, verified against the
// manifest. `num_stages` is the reader's pipeline depth; it must match the
// checkpoint's (resharding is not supported). Errors (each naming the file):
// NotFound (no manifest / missing stage file), InvalidArgument (stage out of
// range, num_stages mismatch), DataLoss (size differs from the manifest,
// e.g. truncated; checksum mismatch; unparsable contents).
absl::StatusOr<SafetensorsFile> ReadStageFile(const std::string& dir,
                                              int64_t step, int stage,
                                              int num_stages);

// Deletes all but the newest `keep_last` complete checkpoints (keep_last ==
// 0 keeps all), plus every incomplete step folder older than the newest
// complete checkpoint (leftovers of crashes). Incomplete folders newer than
// it are kept: they may be in the middle of being written. Never deletes
// the newest complete checkpoint. A checkpoint's manifest is removed before
// its stage files, so a crash mid-prune never leaves a complete-looking
// checkpoint with missing files. InvalidArgument for keep_last < 0.
absl::Status PruneCheckpoints(const std::string& dir, int keep_last);

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_CHECKPOINT_STORE_H_
