#include "cli/submit_spec.h"

#include <unistd.h>

#include "cli/job_client.h"
#include "core/file_util.h"
#include "plan/job_plan.h"

namespace trainyard {

absl::StatusOr<trainyard::v1::JobSpec> ReadSpecForSubmit(
    const std::string& path) {
  absl::StatusOr<trainyard::v1::JobSpec> spec = LoadJobSpecFile(path);
  if (!spec.ok()) return spec.status();
  std::string base = Dirname(path);
  if (!base.empty() && base[0] != '/') {
    char cwd[4096];
    if (getcwd(cwd, sizeof(cwd)) != nullptr)
      base = std::string(cwd) + "/" + base;
  }
  ResolveSpecPaths(base, &*spec);
  FillInputWidthFromLocalData(&*spec);
  return spec;
}

}  // namespace trainyard
