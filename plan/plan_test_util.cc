#include "plan/plan_test_util.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace plan_test {

using ::testing::Contains;
using trainyard::v1::JobSpec;

std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir =
      JoinPath(::testing::TempDir(), absl::StrCat("job_plan_", info->name()));
  EXPECT_TRUE(CreateDirectories(dir).ok());
  return dir;
}

void WriteRawNpy(const std::string& path, const std::string& descr,
                 const std::vector<int64_t>& shape, size_t elem_size) {
  std::string dims;
  int64_t n = 1;
  for (int64_t d : shape) {
    absl::StrAppend(&dims, d, ",");
    n *= d;
  }
  if (shape.size() > 1) dims.pop_back();
  std::string header =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': (", dims, "), }");
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out += std::string(static_cast<size_t>(n) * elem_size, '\0');
  ASSERT_TRUE(WriteFileAtomically(path, out).ok()) << path;
}

JobSpec Parse(const std::string& json) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecJson(json, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

JobSpec ValidNpySpec(const std::string& dir) {
  EXPECT_TRUE(CreateDirectories(JoinPath(dir, "data")).ok());
  WriteRawNpy(JoinPath(dir, "data/x.npy"), "<f4", {10, 8}, 4);
  WriteRawNpy(JoinPath(dir, "data/y.npy"), "<f4", {10, 3}, 4);
  return Parse(R"({
    "name": "t",
    "steps": 100,
    "seed": 42,
    "model": {"blocks": [
      {"outFeatures": 16, "ffnHiddenSize": 32},
      {"outFeatures": 16, "ffnHiddenSize": 32, "residual": true,
       "norm": "layernorm"},
      {"outFeatures": 3, "ffnHiddenSize": 8}
    ]},
    "parallelism": {"stages": 2},
    "optimizer": {"lr": 0.001},
    "task": {"plugin": "mse"},
    "data": {
      "train": {"npy": {"features": "data/x.npy", "targets": "data/y.npy"}},
      "batchSize": 4
    }
  })");
}

PlanOptions Options(const std::string& dir) {
  PlanOptions o;
  o.base_dir = dir;
  o.memory_limit_bytes = uint64_t{1} << 40;
  return o;
}

std::vector<std::string> Lines(const absl::Status& status) {
  return absl::StrSplit(std::string(status.message()), '\n');
}

void ExpectProblem(const absl::StatusOr<JobPlan>& plan,
                   const std::string& line) {
  ASSERT_FALSE(plan.ok()) << "expected problem: " << line;
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Lines(plan.status()), Contains(line)) << "message was:\n"
                                                    << plan.status().message();
}

JobSpec FourBlockSpec(const std::string& dir) {
  JobSpec spec = ValidNpySpec(dir);
  auto* blocks = spec.mutable_model()->mutable_blocks();
  *blocks->Add() = blocks->Get(2);
  *blocks->Mutable(2) = blocks->Get(1);
  return spec;
}

}  // namespace plan_test
}  // namespace trainyard
