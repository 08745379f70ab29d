#include "security/tokens.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/file_util.h"
#include "core/sha256.h"
#include "glog/logging.h"

namespace trainyard {
namespace {

constexpr char kHashPrefix[] = "sha256:";
constexpr size_t kMaxUserLength = 64;
constexpr int64_t kMaxTokensFileBytes = 4 << 20;

bool ValidUser(absl::string_view user) {
  if (user.empty() || user.size() > kMaxUserLength) return false;
  for (char c : user) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-' &&
        c != '@') {
      return false;
    }
  }
  return true;
}

bool ValidHash(absl::string_view hex) {
  if (hex.size() != 64) return false;
  for (char c : hex) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return true;
}

const char* RoleName(Role role) {
  return role == Role::kAdmin ? "admin" : "user";
}

absl::Status Unauthenticated(absl::string_view why) {
  return absl::UnauthenticatedError(absl::StrCat(
      why,
      ": this controller requires a bearer token. Set $TRAINYARD_TOKEN (or "
      "$TRAINYARD_TOKEN_FILE, or the CLI's --token_file) to a token an admin "
      "made for you with `trainyard token --user NAME`"));
}

}  // namespace

TokenTable::Stamp TokenTable::StampOf(const struct stat& st) {
  Stamp s;
  s.size = st.st_size;
  s.mtime_ns =
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  s.ctime_ns =
      static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  s.ino = st.st_ino;
  return s;
}

absl::StatusOr<TokenTable::Table> TokenTable::Parse(absl::string_view text,
                                                    const std::string& path) {
  Table table;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": ", why,
                       " (expected: USER ROLE sha256:HEX, see "
                       "`trainyard token`)"));
    };
    if (fields.size() != 3) {
      return bad(absl::StrCat("expected 3 fields, got ", fields.size()));
    }
    if (!ValidUser(fields[0])) {
      return bad("user names are 1..64 of [A-Za-z0-9._@-]");
    }
    Caller caller;
    caller.user = std::string(fields[0]);
    if (fields[1] == "admin") {
      caller.admin = true;
    } else if (fields[1] != "user") {
      return bad("role must be \"user\" or \"admin\"");
    }
    absl::string_view hash = fields[2];
    if (!absl::ConsumePrefix(&hash, kHashPrefix) || !ValidHash(hash)) {
      return bad("the third field must be sha256: and 64 lowercase hex digits");
    }
    auto [it, inserted] = table.emplace(std::string(hash), caller);
    if (!inserted && it->second.user != caller.user) {
      return bad(absl::StrCat("the same token hash is listed for user \"",
                              it->second.user, "\" too"));
    }
  }
  return table;
}

absl::StatusOr<std::unique_ptr<TokenTable>> TokenTable::Load(
    const std::string& path) {
  std::unique_ptr<TokenTable> tokens(new TokenTable(path));
  absl::MutexLock lock(&tokens->mu_);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("tokens file ", path, ": ", std::strerror(errno)));
  }
  if (st.st_size > kMaxTokensFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tokens file ", path, ": ",
                                                   st.st_size, " bytes, limit ",
                                                   kMaxTokensFileBytes));
  }
  auto text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  auto table = Parse(*text, path);
  if (!table.ok()) return table.status();
  if (table->empty()) {
    LOG(WARNING) << "tokens file " << path
                 << " lists no users: every JobService call will be refused "
                    "until one is added (`trainyard token`)";
  }
  tokens->table_ = *std::move(table);
  tokens->stamp_ = StampOf(st);
  tokens->last_check_ = absl::Now();
  return tokens;
}

void TokenTable::MaybeReload() {
  const absl::Time now = absl::Now();
  if (now - last_check_ < absl::Seconds(1)) return;
  last_check_ = now;
  struct stat st;
  if (::stat(path_.c_str(), &st) != 0) {
    LOG(WARNING) << "tokens file " << path_ << ": " << std::strerror(errno)
                 << "; keeping the " << table_.size() << " token(s) loaded";
    return;
  }
  const Stamp stamp = StampOf(st);
  if (stamp == stamp_) return;
  if (st.st_size > kMaxTokensFileBytes) {
    LOG(WARNING) << "tokens file " << path_ << ": " << st.st_size
                 << " bytes, limit " << kMaxTokensFileBytes
                 << "; keeping the tokens loaded";
    return;
  }
  auto text = ReadFileToString(path_);
  absl::StatusOr<Table> table = text.ok() ? Parse(*text, path_) : text.status();
  if (!table.ok()) {
    LOG(WARNING) << table.status().message() << "; keeping the "
                 << table_.size() << " token(s) loaded";
    return;
  }
  LOG(INFO) << "tokens file " << path_ << " reloaded: " << table->size()
            << " token(s)";
  table_ = *std::move(table);
  // Only now: a version that could not be read is tried again next time.
  stamp_ = stamp;
}

absl::StatusOr<Caller> TokenTable::Authenticate(
    absl::string_view authorization) {
  if (authorization.empty()) return Unauthenticated("no token");
  absl::string_view token = authorization;
  if (!absl::ConsumePrefix(&token, "Bearer ") &&
      !absl::ConsumePrefix(&token, "bearer ")) {
    return Unauthenticated(
        "the authorization header is not \"Bearer <token>\"");
  }
  token = absl::StripAsciiWhitespace(token);
  const std::string hash = Sha256Hex(token);
  absl::MutexLock lock(&mu_);
  MaybeReload();
  auto it = table_.find(hash);
  if (it == table_.end()) {
    return Unauthenticated("token not recognised (revoked, or mistyped)");
  }
  return it->second;
}

std::string NewToken() {
  return absl::StrCat("ty_", absl::BytesToHexString(RandomBytes(32)));
}

absl::StatusOr<std::string> TokensFileLine(const std::string& user, Role role,
                                           const std::string& token) {
  if (!ValidUser(user)) {
    return absl::InvalidArgumentError(
        "user: names are 1..64 of [A-Za-z0-9._@-]");
  }
  return absl::StrCat(user, " ", RoleName(role), " ", kHashPrefix,
                      Sha256Hex(token), "\n");
}

absl::Status AppendToken(const std::string& path, const std::string& user,
                         Role role, const std::string& token) {
  auto line = TokensFileLine(user, role, token);
  if (!line.ok()) return line.status();
  // A hand-edited file may lack its last newline: the new line must not be
  // glued onto the last one.
  std::string text = *line;
  absl::StatusOr<std::string> old = ReadFileToString(path);
  if (old.ok() && !old->empty() && old->back() != '\n') text = "\n" + text;
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("tokens file ", path, ": ", std::strerror(errno)));
  }
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = errno;
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size()) || !synced) {
    return absl::InternalError(absl::StrCat(
        "tokens file ", path, ": append failed: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace trainyard
