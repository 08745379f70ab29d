#include "core/file_util.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace trainyard {
namespace {

absl::Status ErrnoError(const std::string& path, absl::string_view what,
                        int err) {
  std::string msg = absl::StrCat(path, ": ", what, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

// Closes a file descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  // Closes now and reports the error, if any.
  int Close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(path, "write failed", errno);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "cannot open", errno);
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(path, "cannot stat", errno);
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is a folder, expected a file"));
  }
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, &out[got], out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(path, "read failed", errno);
    }
    if (n == 0) break;  // shrank while reading
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  // The file may have grown since fstat; read the rest.
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(path, "read failed", errno);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

absl::StatusOr<int64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return ErrnoError(path, "cannot stat", errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  return static_cast<int64_t>(st.st_size);
}

absl::StatusOr<std::vector<std::string>> ListFolder(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> names;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) {
    std::string msg = absl::StrCat(dir, ": cannot list folder: ", ec.message());
    return ec == std::errc::no_such_file_or_directory
               ? absl::NotFoundError(msg)
               : absl::InternalError(msg);
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::vector<std::string>> ExpandGlob(
    const std::string& pattern) {
  glob_t g;
  const int rc = glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) paths.push_back(g.gl_pathv[i]);
  }
  globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty())) {
    return absl::NotFoundError(absl::StrCat("\"", pattern, "\" names no file"));
  }
  if (rc != 0) {
    return absl::InternalError(absl::StrCat(
        "\"", pattern, "\": ",
        rc == GLOB_NOSPACE ? "out of memory" : "a folder cannot be read"));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

absl::Status SyncDirectory(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "cannot open folder", errno);
  FdCloser closer(fd);
  if (::fsync(fd) != 0)
    return ErrnoError(path, "fsync of folder failed", errno);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents, int mode) {
  static std::atomic<uint64_t> counter{0};
  const std::string dir = Dirname(path);
  const std::string tmp =
      absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoError(tmp, "cannot create temp file", errno);
  FdCloser closer(fd);
  absl::Status status = WriteAll(fd, contents, tmp);
  if (status.ok() && ::fsync(fd) != 0) {
    status = ErrnoError(tmp, "fsync failed", errno);
  }
  if (status.ok() && closer.Close() != 0) {
    status = ErrnoError(tmp, "close failed", errno);
  }
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status =
        ErrnoError(path, absl::StrCat("rename from ", tmp, " failed"), errno);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  return SyncDirectory(dir);
}

absl::Status CreateDirectories(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": exists and is not a folder"));
  }
  const std::string parent = Dirname(path);
  if (parent != path && parent != "." && parent != "/") {
    absl::Status s = CreateDirectories(parent);
    if (!s.ok()) return s;
  }
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoError(path, "cannot create folder", errno);
  }
  return absl::OkStatus();
}

std::string ExecutableDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  return Dirname(std::string(buf, static_cast<size_t>(n)));
}

std::string Dirname(const std::string& path) {
  size_t end = path.size();
  while (end > 1 && path[end - 1] == '/') --end;  // ignore trailing slashes
  size_t slash = path.rfind('/', end - 1);
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  while (a.size() > 1 && a.back() == '/') a.remove_suffix(1);
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  if (a == "/") return absl::StrCat("/", b);
  return absl::StrCat(a, "/", b);
}

std::string CleanAbsolutePath(const std::string& path) {
  std::string abs = path;
  if (abs.empty() || abs[0] != '/') {
    char cwd[PATH_MAX];
    abs = absl::StrCat(::getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : "/", "/",
                       path);
  }
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(abs, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.emplace_back(part);
  }
  return "/" + absl::StrJoin(parts, "/");
}

absl::StatusOr<std::string> ResolveSymlinks(const std::string& abs) {
  std::string head = abs;
  std::string tail;
  while (true) {
    char buf[PATH_MAX];
    if (::realpath(head.c_str(), buf) != nullptr) {
      const std::string real = buf;
      if (tail.empty()) return real;
      return real == "/" ? "/" + tail : real + "/" + tail;
    }
    const int why = errno;
    struct stat st;
    if (::lstat(head.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("\"", head,
                       "\" is a symbolic link that does not "
                       "resolve (",
                       std::strerror(why), ")"));
    }
    const size_t slash = head.rfind('/');
    if (slash == std::string::npos || head == "/") return abs;
    tail = tail.empty() ? head.substr(slash + 1)
                        : head.substr(slash + 1) + "/" + tail;
    head = slash == 0 ? "/" : head.substr(0, slash);
  }
}

bool PathIsInside(const std::string& real, const std::string& root) {
  return real == root || root == "/" || absl::StartsWith(real, root + "/");
}

}  // namespace trainyard
