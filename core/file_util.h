// Small POSIX file helpers shared by the file formats (npy, safetensors) and
// the checkpoint store: whole-file reads and crash-safe atomic writes.
//
// Every error names the path and the OS reason (strerror). All functions are
// thread-safe (they share no state beyond the file system).
#ifndef TRAINYARD_CORE_FILE_UTIL_H_
#define TRAINYARD_CORE_FILE_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainyard {

// The whole content of `path`. NotFound if it does not exist.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Size in bytes of the regular file `path`. NotFound if it does not exist.
absl::StatusOr<int64_t> FileSize(const std::string& path);

// Replaces `path` with `contents` so that a crash at any point leaves either
// the old file (or no file) or the complete new one, never a partial one:
// writes a temp file in the same folder, fsyncs it, renames it over `path`
// and fsyncs the folder. The folder must exist. On failure the temp file is
// removed and an existing file at `path` is untouched.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

// mkdir -p: creates `path` and missing parents. OK if it already exists as a
// folder.
absl::Status CreateDirectories(const std::string& path);

// fsyncs the folder `path`, so renames and creations inside it are durable.
absl::Status SyncDirectory(const std::string& path);

// The folder part of `path` ("." when there is none): "a/b/c" -> "a/b".
std::string Dirname(const std::string& path);

// Joins with exactly one '/' between non-empty parts.
std::string JoinPath(absl::string_view a, absl::string_view b);

// The folder of the running binary (from /proc/self/exe; "." if that
// cannot be read).
std::string ExecutableDir();

}  // namespace trainyard

#endif  // TRAINYARD_CORE_FILE_UTIL_H_
