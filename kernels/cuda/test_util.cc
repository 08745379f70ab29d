#include "kernels/cuda/test_util.h"

#include <cmath>
#include <cstring>

namespace trainyard {
namespace gpu {
namespace testing {

std::vector<float> RoundToBf16(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16ToFloat(FloatToBf16(v[i]));
  return out;
}

std::vector<float> RandomFloats(Rng* rng, int64_t n, float scale) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng->Normal() * scale);
  return v;
}

DeviceBuffer Upload(const std::vector<float>& v, DType type) {
  absl::StatusOr<DeviceBuffer> b =
      DeviceBuffer::Allocate(0, v.size() * DTypeSize(type));
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return DeviceBuffer();
  if (type == DType::kFloat32) {
    EXPECT_TRUE(b->CopyFromHost(v.data(), v.size() * 4).ok());
  } else {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = FloatToBf16(v[i]);
    EXPECT_TRUE(b->CopyFromHost(h.data(), h.size() * 2).ok());
  }
  return std::move(*b);
}

DeviceBuffer Poisoned(int64_t n, DType type) {
  absl::StatusOr<DeviceBuffer> b =
      DeviceBuffer::Allocate(0, n * DTypeSize(type));
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return DeviceBuffer();
  EXPECT_TRUE(b->Fill(0xFF).ok());
  return std::move(*b);
}

std::vector<float> Download(const DeviceBuffer& b, int64_t n, DType type) {
  std::vector<float> out(n);
  if (type == DType::kFloat32) {
    absl::Status s = b.CopyToHost(out.data(), n * 4);
    EXPECT_TRUE(s.ok()) << s;
  } else {
    std::vector<uint16_t> h(n);
    absl::Status s = b.CopyToHost(h.data(), n * 2);
    EXPECT_TRUE(s.ok()) << s;
    for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(h[i]);
  }
  return out;
}

::testing::AssertionResult AllClose(const char* what,
                                    const std::vector<float>& actual,
                                    const std::vector<double>& expected,
                                    double rtol, double atol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << what << ": size " << actual.size() << " vs " << expected.size();
  }
  double worst = -1;
  size_t wi = 0;
  bool ok = true;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::fabs(actual[i] - expected[i]);
    const double lim = atol + rtol * std::fabs(expected[i]);
    if (!(err <= lim)) {  // NaN fails
      ok = false;
      const double excess = std::isnan(err) ? 1e300 : err / lim;
      if (excess > worst) {
        worst = excess;
        wi = i;
      }
    }
  }
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": element " << wi << " is " << actual[wi] << ", expected "
         << expected[wi] << " (rtol " << rtol << ", atol " << atol << ")";
}

}  // namespace testing
}  // namespace gpu
}  // namespace trainyard
