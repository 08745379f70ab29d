// The arithmetic that turns a step's reduced numbers into its totals: the
// loss, the global gradient norm and the gradient scale (worker/
// step_reducer.h states the formulas). Written once, here, for every place
// that computes them: the host after the pipeline's all-reduce, and the
// device itself when a one-stage job keeps its step on the device (a CUDA
// kernel of kernels/cuda/step_kernels.cu, or the simulated device's host
// code). Plain arithmetic on doubles in a fixed order, IEEE-rounded on
// both (compiled without FMA contraction on the GPU), so both give the same
// bits.
//
// Also the layout of the per-microbatch words a device step writes (the
// engine's checks next to the task plugin's slots, task_abi.h), which the
// device-side totals read.
#ifndef TRAINYARD_CORE_STEP_TOTALS_H_
#define TRAINYARD_CORE_STEP_TOTALS_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TY_HOST_DEVICE __host__ __device__
#else
#define TY_HOST_DEVICE
#endif

namespace trainyard {

// Outcome codes of ComputeStepTotals.
inline constexpr int kTotalsOk = 0;
inline constexpr int kTotalsNoWeight = 1;  // sum(w) is not > 0 (or not finite)
// kTotalsBadParam + p: parameter p's sum of squares is not finite.
inline constexpr int kTotalsBadParam = 2;

struct StepTotalsValues {
  double loss = 0;
  double grad_norm = 0;
  double grad_scale = 1;
  int code = kTotalsOk;
};

// loss = loss_sum / weight; grad_norm = sqrt(sum of sums) / weight (sums
// added in parameter order); grad_scale = 1 / weight, times
// clip / (grad_norm + 1e-6) when clip > 0 and that is < 1.
TY_HOST_DEVICE inline StepTotalsValues ComputeStepTotals(
    const double* sums_of_squares, int num_params, double weight_sum,
    double loss_sum, double clip) {
  StepTotalsValues t;
  if (!(weight_sum > 0) || !std::isfinite(weight_sum)) {
    t.code = kTotalsNoWeight;
    return t;
  }
  double sumsq = 0;
  for (int p = 0; p < num_params; ++p) {
    if (!std::isfinite(sums_of_squares[p])) {
      t.code = kTotalsBadParam + p;
      return t;
    }
    sumsq += sums_of_squares[p];
  }
  t.loss = loss_sum / weight_sum;
  t.grad_norm = std::sqrt(sumsq) / weight_sum;
  t.grad_scale = 1.0 / weight_sum;
  if (clip > 0) {
    const double coef = clip / (t.grad_norm + 1e-6);
    if (coef < 1.0) t.grad_scale *= coef;
  }
  return t;
}

// Per-microbatch words of a device step (8 bytes each): the engine's
// checks, then the plugin's slots (task_abi.h; slot 0 w, slot 1 w * loss,
// slot 2 the plugin's bad-input marker).
inline constexpr int kCheckOutput = 0;  // FindNonFinite slot of the output
inline constexpr int kCheckGrad = 2;    // ... of the loss gradient
inline constexpr int kCheckWords = 4;

// Whether a FindNonFinite slot (two words) recorded an element.
TY_HOST_DEVICE inline bool NonFiniteFound(const double* slot) {
  uint64_t bits;
  std::memcpy(&bits, slot, sizeof(bits));
  return bits != 0;
}

// What a one-stage device step needs for its totals, all device memory of
// one buffer: the stage's sums of squares, then num_microbatches blocks of
// `stride` words (checks at 0, plugin slots at kCheckWords).
struct DeviceTotalsArgs {
  const double* sums_of_squares = nullptr;
  int num_params = 0;
  const double* microbatches = nullptr;
  int num_microbatches = 0;
  int stride = 0;
  double clip = 0;
  // Out: [loss, grad_norm, grad_scale, skip]; skip = 1 when the step must
  // not change the parameters (a check failed, a slot broke the ABI's
  // contract, or ComputeStepTotals refused): the host then reads why.
  double* totals = nullptr;
};
inline constexpr int kTotalsWords = 4;
inline constexpr int kTotalsScaleWord = 2;
inline constexpr int kTotalsSkipWord = 3;

// The totals of a one-stage step, from its microbatches' slots summed in
// microbatch order (the host's order, engine/loss_head.h).
TY_HOST_DEVICE inline void ComputeDeviceTotals(const DeviceTotalsArgs& a) {
  double weight_sum = 0, loss_sum = 0;
  bool bad = false;
  for (int m = 0; m < a.num_microbatches; ++m) {
    const double* mb = a.microbatches + m * a.stride;
    const double* slots = mb + kCheckWords;
    const double w = slots[0], wl = slots[1];
    bad = bad || NonFiniteFound(mb + kCheckOutput) ||
          NonFiniteFound(mb + kCheckGrad) || slots[2] != 0 ||
          !std::isfinite(w) || w < 0 || !std::isfinite(w > 0 ? wl / w : wl) ||
          (w == 0 && wl != 0);
    weight_sum += w;
    loss_sum += wl;
  }
  const StepTotalsValues t = ComputeStepTotals(a.sums_of_squares, a.num_params,
                                               weight_sum, loss_sum, a.clip);
  a.totals[0] = t.loss;
  a.totals[1] = t.grad_norm;
  a.totals[2] = t.grad_scale;
  a.totals[3] = bad || t.code != kTotalsOk ? 1.0 : 0.0;
}

}  // namespace trainyard

#endif  // TRAINYARD_CORE_STEP_TOTALS_H_
