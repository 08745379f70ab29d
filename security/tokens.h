// Users and bearer tokens: the controller's tokens file and the checks made
// on every JobService call.
//
// The tokens file has one user per line, `#` comments and blank lines
// allowed:
//
//   # user   role   sha256 of the token
//   alice    user   sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd6...
//   ops      admin  sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822c...
//
// Only hashes are stored; the token itself (`ty_` + 64 hex digits, 256 random
// bits) is shown once, when `trainyard token` or `trainyard certs` makes it.
// A user may have several lines (several tokens, e.g. while rotating). User
// names are 1..64 of [A-Za-z0-9._@-]; roles are `user` (their own jobs) and
// `admin` (every job).
//
// Thread safety: TokenTable is thread-safe.
#ifndef TRAINYARD_SECURITY_TOKENS_H_
#define TRAINYARD_SECURITY_TOKENS_H_

#include <sys/stat.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trainyard {

// Who made a call.
struct Caller {
  std::string user;  // empty on an --insecure controller (anyone)
  bool admin = false;
};

enum class Role { kUser, kAdmin };

class TokenTable {
 public:
  // Reads and parses `path`. InvalidArgument naming the path and line for a
  // malformed line (never echoing a hash or token), NotFound / PermissionDenied
  // when it cannot be read.
  static absl::StatusOr<std::unique_ptr<TokenTable>> Load(
      const std::string& path);

  // The caller for the value of an `authorization` request header
  // ("Bearer <token>"). Unauthenticated, with a message that says what to
  // do, when the header is missing, malformed or the token unknown.
  // Re-reads the file when its size or modification time changed (checked
  // at most once a second), so users can be added and tokens revoked
  // without a restart; a file that no longer parses keeps the last good
  // table (and logs why).
  absl::StatusOr<Caller> Authenticate(absl::string_view authorization);

  const std::string& path() const { return path_; }

 private:
  // What tells a changed file: a rewrite through a new inode (editors,
  // Kubernetes Secret updates) changes ino; an in-place edit changes
  // ctime, which `cp -p` and `touch -r` cannot set back.
  struct Stamp {
    int64_t size = -1;
    int64_t mtime_ns = -1;
    int64_t ctime_ns = -1;
    uint64_t ino = 0;
    bool operator==(const Stamp& o) const {
      return size == o.size && mtime_ns == o.mtime_ns &&
             ctime_ns == o.ctime_ns && ino == o.ino;
    }
  };
  static Stamp StampOf(const struct stat& st);
  // token hash (hex) -> caller
  using Table = std::map<std::string, Caller>;

  explicit TokenTable(std::string path) : path_(std::move(path)) {}
  static absl::StatusOr<Table> Parse(absl::string_view text,
                                     const std::string& path);
  void MaybeReload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  Table table_ ABSL_GUARDED_BY(mu_);
  Stamp stamp_ ABSL_GUARDED_BY(mu_);
  absl::Time last_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// A fresh token: "ty_" + 64 lowercase hex digits.
std::string NewToken();

// The tokens-file line for `token` (its hash, never the token).
// InvalidArgument for a user name outside the allowed characters.
absl::StatusOr<std::string> TokensFileLine(const std::string& user, Role role,
                                           const std::string& token);

// Appends TokensFileLine to `path` (creating it 0600), so a running
// controller picks the user up within a second.
absl::Status AppendToken(const std::string& path, const std::string& user,
                         Role role, const std::string& token);

}  // namespace trainyard

#endif  // TRAINYARD_SECURITY_TOKENS_H_
