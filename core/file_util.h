// Small POSIX file helpers shared by the file formats (npy, safetensors) and
// the checkpoint store: whole-file reads and crash-safe atomic writes.
//
// Every error names the path and the OS reason (strerror). All functions are
// thread-safe (they share no state beyond the file system).
#ifndef TRAINYARD_CORE_FILE_UTIL_H_
#define TRAINYARD_CORE_FILE_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

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
// removed and an existing file at `path` is untouched. `mode` is the new
// file's permission bits (before the umask), e.g. 0600 for a private key.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents, int mode = 0644);

// mkdir -p: creates `path` and missing parents. OK if it already exists as a
// folder.
absl::Status CreateDirectories(const std::string& path);

// The names in folder `dir` (no "." or ".."), sorted. NotFound when it does
// not exist; Internal naming the folder when it cannot be listed.
absl::StatusOr<std::vector<std::string>> ListFolder(const std::string& dir);

// The files `pattern` (an absolute path, possibly with glob characters
// `*`, `?`, `[...]`; POSIX glob(3) rules, no `~` or braces) names, sorted by
// name. NotFound naming the pattern when it names none.
absl::StatusOr<std::vector<std::string>> ExpandGlob(const std::string& pattern);

// fsyncs the folder `path`, so renames and creations inside it are durable.
absl::Status SyncDirectory(const std::string& path);

// The folder part of `path` ("." when there is none): "a/b/c" -> "a/b".
std::string Dirname(const std::string& path);

// Joins with exactly one '/' between non-empty parts.
std::string JoinPath(absl::string_view a, absl::string_view b);

// The folder of the running binary (from /proc/self/exe; "." if that
// cannot be read).
std::string ExecutableDir();

// `path` made absolute against the current folder (when relative) and
// lexically cleaned: "//", "." and ".." collapsed ("/a/../../b" -> "/b").
std::string CleanAbsolutePath(const std::string& path);

// The clean absolute path `abs` with symlinks resolved: the real path of its
// longest existing prefix, plus the rest (so a folder not made yet counts).
// FailedPrecondition when a prefix exists but does not resolve (a dangling
// symlink, a loop): where it points is unknown, so nothing can be said
// about where the path leads.
absl::StatusOr<std::string> ResolveSymlinks(const std::string& abs);

// Whether the resolved path `real` is `root` or inside it (both resolved).
bool PathIsInside(const std::string& real, const std::string& root);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_FILE_UTIL_H_
