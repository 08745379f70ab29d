#include "engine/step_reducer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "core/step_totals.h"

namespace trainyard {

absl::Status TotalsError(const JobPlan& plan, const StepTotalsValues& v,
                         double weight_sum, int64_t step) {
  if (v.code == kTotalsNoWeight) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step + 1, ": total loss weight is ", weight_sum,
                     " (every sample was ignored by the task); step refused"));
  }
  if (v.code >= kTotalsBadParam) {
    const auto& ps = plan.params[v.code - kTotalsBadParam];
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step + 1, ": stage ", ps.stage, " parameter ",
                     ps.name, " has a non-finite gradient; step refused"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepTotals> ReduceStep(const JobPlan& plan,
                                      const StepContributions& mine,
                                      Transport* transport,
                                      absl::Duration timeout, int64_t step,
                                      const std::string& where,
                                      double* comm_seconds) {
  const int num_params = static_cast<int>(plan.params.size());
  std::vector<double> reduce(num_params + 3, 0.0);
  for (size_t i = 0; i < mine.params.size(); ++i) {
    reduce[mine.params[i]] = mine.sums_of_squares[i];
  }
  if (mine.is_last) {
    reduce[num_params] = mine.weight_sum;
    reduce[num_params + 1] = mine.loss_sum;
  }
  reduce[num_params + 2] = mine.checkpoint_file_written ? 1.0 : 0.0;
  if (transport != nullptr && transport->world_size() > 1) {
    const absl::Time start = absl::Now();
    absl::Status st = transport->AllReduceSum(&reduce, timeout);
    *comm_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    if (!st.ok()) {
      return Prefixed(st, absl::StrCat(where, ": all-reduce: "));
    }
  }
  const double clip = plan.spec.optimizer().clip_grad();
  const StepTotalsValues v =
      ComputeStepTotals(reduce.data(), num_params, reduce[num_params],
                        reduce[num_params + 1], clip);
  RETURN_IF_ERROR(TotalsError(plan, v, reduce[num_params], step));
  StepTotals t;
  t.loss = v.loss;
  t.grad_norm = v.grad_norm;
  t.grad_scale = v.grad_scale;
  t.checkpoint_files_written = static_cast<int>(reduce[num_params + 2]);
  return t;
}

}  // namespace trainyard
