// The job spec `trainyard submit` and `trainyard up --run` send: the spec
// file's relative paths made absolute against its folder, and block 0's
// width read from local data where the file leaves it unset.
#ifndef TRAINYARD_CLI_SUBMIT_SPEC_H_
#define TRAINYARD_CLI_SUBMIT_SPEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/job_spec.pb.h"

namespace trainyard {

// Loads the spec file (LoadJobSpecFile's errors), then ResolveSpecPaths
// against its folder (made absolute against the current folder) and
// FillInputWidthFromLocalData.
absl::StatusOr<trainyard::v1::JobSpec> ReadSpecForSubmit(
    const std::string& path);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_SUBMIT_SPEC_H_
