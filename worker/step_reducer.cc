#include "worker/step_reducer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"

namespace trainyard {

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
  const double weight = reduce[num_params];
  if (!(weight > 0) || !std::isfinite(weight)) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step + 1, ": total loss weight is ", weight,
                     " (every sample was ignored by the task); step refused"));
  }
  double sumsq = 0;
  for (int p = 0; p < num_params; ++p) {
    if (!std::isfinite(reduce[p])) {
      const auto& ps = plan.params[p];
      return absl::FailedPreconditionError(
          absl::StrCat("step ", step + 1, ": stage ", ps.stage, " parameter ",
                       ps.name, " has a non-finite gradient; step refused"));
    }
    sumsq += reduce[p];
  }
  StepTotals t;
  t.loss = reduce[num_params + 1] / weight;
  t.grad_norm = std::sqrt(sumsq) / weight;
  t.grad_scale = 1.0 / weight;
  t.checkpoint_files_written = static_cast<int>(reduce[num_params + 2]);
  const double clip = plan.spec.optimizer().clip_grad();
  if (clip > 0) {
    const double coef = clip / (t.grad_norm + 1e-6);
    if (coef < 1.0) t.grad_scale *= coef;
  }
  return t;
}

}  // namespace trainyard
