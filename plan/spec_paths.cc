#include "plan/spec_paths.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"

namespace trainyard {

std::string ResolvePath(const std::string& base, const std::string& path) {
  if (!path.empty() && path[0] == '/') return CleanAbsolutePath(path);
  return CleanAbsolutePath(CleanAbsolutePath(base) + "/" + path);
}

void CheckConfined(Problems* p, const std::string& field,
                   const std::string& written, const std::string& abs,
                   const PlanOptions& options) {
  if (options.confine_to.empty()) return;
  absl::StatusOr<std::string> root =
      ResolveSymlinks(CleanAbsolutePath(options.confine_to));
  if (!root.ok()) {
    p->Add(field,
           absl::StrCat("the data folder ", options.confine_to, " (",
                        options.confine_flag, "): ", root.status().message()));
    return;
  }
  absl::StatusOr<std::string> real = ResolveSymlinks(abs);
  if (!real.ok()) {
    p->Add(field, absl::StrCat(Quote(written),
                               " cannot be shown to stay inside the data "
                               "folder ",
                               *root, ": ", real.status().message()));
    return;
  }
  if (PathIsInside(*real, *root)) return;
  p->Add(field,
         absl::StrCat(Quote(written), " resolves to ", Quote(*real),
                      ", outside the data folder ", *root, " (",
                      options.confine_flag, "): paths must stay inside it"));
}

std::string FileProblem(const std::string& as_written, const std::string& abs) {
  struct stat st;
  std::string where = as_written;
  if (as_written != abs) where = absl::StrCat(as_written, " (", abs, ")");
  if (stat(abs.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::StrCat(where, ": no such file");
    return absl::StrCat(where, ": ", std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return absl::StrCat(where, ": not a regular file");
  return "";
}

}  // namespace trainyard
