// ReduceStep: what every stage of a step agrees on before its optimizer
// update — the loss, the global gradient norm and the gradient scale —
// from one small all-reduce across the pipeline:
//
//   vector = [sum of squares of each parameter's raw gradient, one slot per
//             parameter of the whole model] ++ [sum of loss weights,
//             sum of weight * loss, stages whose file of the pending
//             checkpoint is written]
//
// Each slot has exactly one contributor (the stage owning the parameter;
// the last stage for the loss sums), so the reduction is exact and the
// result is bitwise the same for any stage split and schedule.
//
//   loss      = sum(w L) / sum(w)
//   grad_norm = sqrt(sum of squares) / sum(w)   (the mean loss's gradient)
//   scale     = 1 / sum(w), times clip / (grad_norm + 1e-6) when that is < 1
//
// A total weight that is not > 0 or a non-finite gradient refuses the step
// (FailedPrecondition naming the step, and the stage and parameter).
#ifndef TRAINYARD_ENGINE_STEP_REDUCER_H_
#define TRAINYARD_ENGINE_STEP_REDUCER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/step_totals.h"
#include "plan/job_plan.h"
#include "transport/transport.h"

namespace trainyard {

struct StepTotals {
  double loss = 0;
  double grad_norm = 0;
  double grad_scale = 1;  // applied to the raw accumulated gradients
  // How many stages have written their file of the pending checkpoint (the
  // asynchronous checkpoints of engine/stage_runner.cc).
  int checkpoint_files_written = 0;
};

struct StepContributions {
  // Index into plan.params and raw gradient sum of squares of each of the
  // stage's parameters.
  std::vector<int> params;
  std::vector<double> sums_of_squares;
  bool is_last = false;
  double weight_sum = 0;  // last stage only
  double loss_sum = 0;
  bool checkpoint_file_written = false;  // this stage's, of the pending one
};

// The error of a refused step (ComputeStepTotals's code, core/
// step_totals.h), naming the step and the stage and parameter; OK for
// kTotalsOk. `v` was computed over all of plan.params.
absl::Status TotalsError(const JobPlan& plan, const StepTotalsValues& v,
                         double weight_sum, int64_t step);

// `transport` may be null for a one-stage job. `step` is 0-based; `where`
// ("stage 2") prefixes transport errors; the all-reduce's wall time is
// added to *comm_seconds.
absl::StatusOr<StepTotals> ReduceStep(const JobPlan& plan,
                                      const StepContributions& mine,
                                      Transport* transport,
                                      absl::Duration timeout, int64_t step,
                                      const std::string& where,
                                      double* comm_seconds);

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_STEP_REDUCER_H_
