// Test-only: random per-microbatch gradients for the summation-order tests
// (engine/gradient_tree_test.cc, engine/replica_group_test.cc).
#ifndef TRAINYARD_ENGINE_TEST_GRADIENTS_H_
#define TRAINYARD_ENGINE_TEST_GRADIENTS_H_

#include <cstdint>
#include <random>
#include <vector>

#include "core/tensor.h"

namespace trainyard {
namespace testing {

// `count` float32 [n] host tensors of values of mixed magnitudes (up to
// 2^19), so that a different association of their sum changes its bits.
inline std::vector<Tensor> RandomGradients(int count, int64_t n,
                                           uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<Tensor> out;
  for (int m = 0; m < count; ++m) {
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng) * (1 << (rng() % 20));
    out.push_back(Tensor::FromVector(v, {n}));
  }
  return out;
}

// A float32 host tensor's values.
inline std::vector<float> Values(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

}  // namespace testing
}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_TEST_GRADIENTS_H_
