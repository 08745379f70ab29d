// Helpers the planner's tests share: a folder per test, .npy files of any
// dtype, a valid spec to break one field of at a time, and the check that
// a plan failed with a given problem.
#ifndef TRAINYARD_PLAN_PLAN_TEST_UTIL_H_
#define TRAINYARD_PLAN_PLAN_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plan/job_plan.h"
#include "proto/job_spec.pb.h"

namespace trainyard {
namespace plan_test {

// A fresh folder per test under the test's temp dir.
std::string TestDir();

// Writes a version 1.0 .npy file with any dtype descriptor (so tests can
// make files the reader accepts but the planner must refuse), zero data.
void WriteRawNpy(const std::string& path, const std::string& descr,
                 const std::vector<int64_t>& shape, size_t elem_size);

// The spec in `json`; a test failure (and an empty spec) when it does not
// parse.
trainyard::v1::JobSpec Parse(const std::string& json);

// A valid spec over data/x.npy float32 [10, 8] and data/y.npy float32
// [10, 3] in `dir`: blocks 8 -> 16 -> 16 (layernorm, residual) -> 3.
trainyard::v1::JobSpec ValidNpySpec(const std::string& dir);

// ValidNpySpec with a second 16 -> 16 block: 8 -> 16 -> 16 -> 16 -> 3.
trainyard::v1::JobSpec FourBlockSpec(const std::string& dir);

// Paths relative to `dir`, and a memory limit (1 TiB) no test spec reaches.
PlanOptions Options(const std::string& dir);

// The lines of the status's message.
std::vector<std::string> Lines(const absl::Status& status);

// Asserts the plan failed validation and `line` is one of the problems.
void ExpectProblem(const absl::StatusOr<JobPlan>& plan,
                   const std::string& line);

}  // namespace plan_test
}  // namespace trainyard

#endif  // TRAINYARD_PLAN_PLAN_TEST_UTIL_H_
