// Test helpers for the CUDA kernels: skip without a device, upload / download
// float32 and bfloat16 data, poisoned outputs, tolerant comparison.
#ifndef TRAINYARD_KERNELS_CUDA_TEST_UTIL_H_
#define TRAINYARD_KERNELS_CUDA_TEST_UTIL_H_

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/bfloat16.h"
#include "core/random.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/runtime.h"

// First statement of every GPU test: skips (visibly) when there is no usable
// device, naming the CUDA error (or "built without CUDA"). With
// TRAINYARD_REQUIRE_GPU=1 in the environment (tools/gpu_check.sh sets it on
// GPU machines) a missing device fails the test instead.
#define SKIP_WITHOUT_CUDA_DEVICE()                                   \
  do {                                                               \
    const ::absl::Status _ty_dev = ::trainyard::gpu::CheckDevice(0); \
    if (!_ty_dev.ok()) {                                             \
      const char* _ty_req = std::getenv("TRAINYARD_REQUIRE_GPU");    \
      if (_ty_req != nullptr && std::string(_ty_req) == "1") {       \
        FAIL() << "TRAINYARD_REQUIRE_GPU=1 but no CUDA device: "     \
               << _ty_dev.message();                                 \
      }                                                              \
      GTEST_SKIP() << "no CUDA device: " << _ty_dev.message();       \
    }                                                                \
  } while (0)

namespace trainyard {
namespace gpu {
namespace testing {

// bfloat16 bits <-> float (round to nearest even), as cuda_bf16.h does.
using ::trainyard::Bf16ToFloat;
using ::trainyard::FloatToBf16;
// Values rounded through bfloat16.
std::vector<float> RoundToBf16(const std::vector<float>& v);

std::vector<float> RandomFloats(Rng* rng, int64_t n, float scale);

// Device copy of `v` as `type` (bfloat16 rounds).
DeviceBuffer Upload(const std::vector<float>& v, DType type);
// A device buffer of n elements of `type`, every byte 0xFF (NaN).
DeviceBuffer Poisoned(int64_t n, DType type);
std::vector<float> Download(const DeviceBuffer& b, int64_t n, DType type);

// |a - e| <= atol + rtol |e| for all elements; names `what` and the worst.
::testing::AssertionResult AllClose(const char* what,
                                    const std::vector<float>& actual,
                                    const std::vector<double>& expected,
                                    double rtol, double atol);

// Tolerances per dtype (relative), stated in docs/GPU.md.
constexpr double kFp32Tol = 1e-5;
constexpr double kTf32Tol = 1e-3;
constexpr double kBf16Tol = 1e-2;

}  // namespace testing
}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_TEST_UTIL_H_
