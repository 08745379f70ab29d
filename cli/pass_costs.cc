#include "cli/pass_costs.h"

#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "proto/trainyard.pb.h"
#include "schedule/schedule.h"

namespace trainyard {

std::optional<PassCosts> ParseCosts(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ',');
  double v[3];
  bool ok = parts.size() == 3;
  for (size_t i = 0; ok && i < 3; ++i) {
    ok = absl::SimpleAtod(parts[i], &v[i]) && std::isfinite(v[i]) && v[i] >= 0;
  }
  if (!ok || v[0] + v[1] + v[2] <= 0) return std::nullopt;
  return PassCosts{v[0], v[1], v[2]};
}

std::optional<PassCosts> MeanPassCosts(
    const trainyard::v1::GetTraceResponse& trace) {
  double sum[3] = {0, 0, 0};
  int n[3] = {0, 0, 0};
  for (const auto& stage : trace.stages()) {
    std::set<int> microbatches[3];
    for (const auto& span : stage.spans()) {
      const int k = span.kind() == trainyard::v1::SPAN_FORWARD           ? 0
                    : span.kind() == trainyard::v1::SPAN_BACKWARD_INPUT  ? 1
                    : span.kind() == trainyard::v1::SPAN_BACKWARD_WEIGHT ? 2
                                                                         : -1;
      if (k < 0) continue;
      sum[k] += static_cast<double>(span.end_us() - span.start_us()) / 1e3;
      microbatches[k].insert(span.microbatch());
    }
    // A stage that chains its weight passes (plan/job_plan.h,
    // ChainsWeightPasses) traces them as one span of no microbatch: it
    // counts for each microbatch the stage ran forward.
    if (microbatches[2].erase(-1) > 0) {
      microbatches[2].insert(microbatches[0].begin(), microbatches[0].end());
    }
    for (int k = 0; k < 3; ++k) n[k] += microbatches[k].size();
  }
  if (n[0] == 0 || n[1] == 0 || n[2] == 0) return std::nullopt;
  return PassCosts{sum[0] / n[0], sum[1] / n[1], sum[2] / n[2]};
}

}  // namespace trainyard
