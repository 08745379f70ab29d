// Helpers of the NpyShards tests: shard files with known rows written to
// the test's scratch folder, and checks against their concatenation.
#ifndef TRAINYARD_CORE_NPY_SHARDS_TEST_UTIL_H_
#define TRAINYARD_CORE_NPY_SHARDS_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/npy_shards.h"
#include "core/tensor.h"

namespace trainyard {
namespace testing {

// A path in the test's scratch folder ($TEST_TMPDIR under bazel test).
std::string TmpPath(const std::string& name);
// `t` written as TmpPath(name) by WriteNpy; returns the path.
std::string Write(const std::string& name, const Tensor& t);
// A version 1.0 .npy file by hand (for dtypes WriteNpy does not write).
std::string WriteRaw(const std::string& name, const std::string& descr,
                     const std::string& shape, const std::string& data);
// Features [rows, d] with distinct values: row r (of the whole source,
// `first` + local row), column j holds r * 1000 + j.
Tensor Features(int64_t first, int64_t rows, int64_t d);
// Targets for rows [first, first + rows): class id 7 * r of `dtype`, or for
// float32 a [rows, k] matrix holding r + j / 10.
Tensor Targets(DType dtype, int64_t first, int64_t rows, int64_t k);

struct Files {
  std::vector<std::string> features, targets;
  Tensor all_x, all_y;  // the concatenation, in memory
};

// Shards of the given row counts, D = 3, targets of `dtype` (K = 2 for
// float32), named <prefix>x_i.npy / <prefix>y_i.npy.
Files MakeShards(const std::string& prefix, const std::vector<int64_t>& rows,
                 DType dtype);
// `features` (written already, of `rows` rows each) paired with class-id
// targets of `dtype` for the same rows, named <prefix>y_i.npy.
Files WithTargets(const std::string& prefix, std::vector<std::string> features,
                  const std::vector<int64_t>& rows, DType dtype);
// Row `r` of `t` (any dtype) as bytes.
std::string RowBytes(const Tensor& t, int64_t r);
// Checks Gather(rows) against the in-memory concatenation.
void ExpectGatherMatches(const NpyShards& source, const Files& f,
                         const std::vector<int64_t>& rows, int64_t offset);
// NpyShards::Open of `f` (a test failure and null if it fails).
std::shared_ptr<const NpyShards> MustOpen(const Files& f);
// 0 .. n-1 in a fixed random order.
std::vector<int64_t> Shuffled(int64_t n, uint32_t seed);

}  // namespace testing
}  // namespace trainyard

#endif  // TRAINYARD_CORE_NPY_SHARDS_TEST_UTIL_H_
