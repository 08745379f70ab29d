// The paths in a spec (data files, init safetensors, checkpoint dir): made
// absolute against PlanOptions::base_dir, kept inside PlanOptions::confine_to,
// and checked to be readable files.
#ifndef TRAINYARD_PLAN_SPEC_PATHS_H_
#define TRAINYARD_PLAN_SPEC_PATHS_H_

#include <string>

#include "plan/job_plan.h"
#include "plan/problems.h"

namespace trainyard {

// `path` made absolute against `base` (itself made absolute against the
// current directory).
std::string ResolvePath(const std::string& base, const std::string& path);

// Adds a problem for `field` when `abs` (as written: `written`) is not
// inside options.confine_to once symlinks are resolved; nothing when no
// folder is set.
void CheckConfined(Problems* p, const std::string& field,
                   const std::string& written, const std::string& abs,
                   const PlanOptions& options);

// Empty when `abs` is a readable regular file; otherwise the reason, naming
// the path as the user wrote it (and where it was looked for).
std::string FileProblem(const std::string& as_written, const std::string& abs);

}  // namespace trainyard

#endif  // TRAINYARD_PLAN_SPEC_PATHS_H_
