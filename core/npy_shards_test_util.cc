#include "core/npy_shards_test_util.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/npy.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace testing {

// A path in the test's scratch folder ($TEST_TMPDIR under bazel test).
std::string TmpPath(const std::string& name) {
  return JoinPath(::testing::TempDir(), name);
}

std::string Write(const std::string& name, const Tensor& t) {
  const std::string path = TmpPath(name);
  EXPECT_TRUE(WriteNpy(path, t).ok()) << path;
  return path;
}

// A version 1.0 .npy file by hand (for dtypes WriteNpy does not write).
std::string WriteRaw(const std::string& name, const std::string& descr,
                     const std::string& shape, const std::string& data) {
  const std::string dict =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': ", shape, ", }\n");
  std::string bytes("\x93NUMPY\x01\x00", 8);
  bytes.push_back(static_cast<char>(dict.size() & 0xFF));
  bytes.push_back(static_cast<char>(dict.size() >> 8));
  const std::string path = TmpPath(name);
  EXPECT_TRUE(WriteFileAtomically(path, bytes + dict + data).ok()) << path;
  return path;
}

// Features [rows, d] with distinct values: row r (of the whole source,
// `first` + local row), column j holds r * 1000 + j.
Tensor Features(int64_t first, int64_t rows, int64_t d) {
  Tensor t = Tensor::Empty(DType::kFloat32, {rows, d});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < d; ++j) {
      t.data<float>()[r * d + j] = static_cast<float>((first + r) * 1000 + j);
    }
  }
  return t;
}

// Targets for rows [first, first + rows): class id 7 * r of `dtype`, or for
// float32 a [rows, k] matrix holding r + j / 10.
Tensor Targets(DType dtype, int64_t first, int64_t rows, int64_t k) {
  if (dtype == DType::kFloat32) {
    Tensor t = Tensor::Empty(dtype, {rows, k});
    for (int64_t i = 0; i < rows * k; ++i) {
      t.data<float>()[i] = static_cast<float>(first + i / k) + (i % k) / 10.f;
    }
    return t;
  }
  Tensor t = Tensor::Empty(dtype, {rows});
  for (int64_t r = 0; r < rows; ++r) {
    if (dtype == DType::kInt32) {
      t.data<int32_t>()[r] = static_cast<int32_t>(7 * (first + r));
    } else {
      t.data<int64_t>()[r] = (int64_t{1} << 40) + 7 * (first + r);
    }
  }
  return t;
}

// Shards of the given row counts, D = 3, targets of `dtype` (K = 2 for
// float32), named <prefix>x_i.npy / <prefix>y_i.npy.
Files MakeShards(const std::string& prefix, const std::vector<int64_t>& rows,
                 DType dtype) {
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  const int64_t k = dtype == DType::kFloat32 ? 2 : 0;
  Files f;
  f.all_x = Features(0, total, 3);
  f.all_y = Targets(dtype, 0, total, k);
  int64_t first = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    f.features.push_back(Write(absl::StrCat(prefix, "x_", i, ".npy"),
                               Features(first, rows[i], 3)));
    f.targets.push_back(Write(absl::StrCat(prefix, "y_", i, ".npy"),
                              Targets(dtype, first, rows[i], k)));
    first += rows[i];
  }
  return f;
}

// `features` (written already, of `rows` rows each) paired with class-id
// targets of `dtype` for the same rows, named <prefix>y_i.npy.
Files WithTargets(const std::string& prefix, std::vector<std::string> features,
                  const std::vector<int64_t>& rows, DType dtype) {
  Files f;
  f.features = std::move(features);
  int64_t first = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    f.targets.push_back(Write(absl::StrCat(prefix, "y_", i, ".npy"),
                              Targets(dtype, first, rows[i], 0)));
    first += rows[i];
  }
  return f;
}

// Row `r` of `t` (any dtype) as bytes.
std::string RowBytes(const Tensor& t, int64_t r) {
  const size_t row = t.nbytes() / t.dim(0);
  return std::string(static_cast<const char*>(t.raw_data()) + r * row, row);
}

// Checks Gather(rows) against the in-memory concatenation.
void ExpectGatherMatches(const NpyShards& source, const Files& f,
                         const std::vector<int64_t>& rows, int64_t offset) {
  auto got = source.Gather(rows);
  ASSERT_TRUE(got.ok()) << got.status();
  const auto& [x, y] = *got;
  ASSERT_EQ(x.shape(), (Shape{static_cast<int64_t>(rows.size()), 3}));
  ASSERT_EQ(y.dtype(), f.all_y.dtype());
  ASSERT_EQ(y.dim(0), static_cast<int64_t>(rows.size()));
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(RowBytes(x, i), RowBytes(f.all_x, offset + rows[i])) << i;
    EXPECT_EQ(RowBytes(y, i), RowBytes(f.all_y, offset + rows[i])) << i;
  }
}

std::shared_ptr<const NpyShards> MustOpen(const Files& f) {
  auto source = NpyShards::Open(f.features, f.targets);
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? *source : nullptr;
}

std::vector<int64_t> Shuffled(int64_t n, uint32_t seed) {
  std::vector<int64_t> rows(n);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), std::mt19937(seed));
  return rows;
}

}  // namespace testing
}  // namespace trainyard
