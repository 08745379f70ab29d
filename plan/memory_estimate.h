// The memory a planned job is estimated to need (docs/SPEC.md, "Memory"),
// and the check against the limit.
#ifndef TRAINYARD_PLAN_MEMORY_ESTIMATE_H_
#define TRAINYARD_PLAN_MEMORY_ESTIMATE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "plan/job_plan.h"

namespace trainyard {

// The estimate for a placed plan whose data sources take `data_bytes`.
MemoryEstimate EstimateMemory(const JobPlan& plan, uint64_t data_bytes);

// OK when `estimate` fits options.memory_limit_bytes (0: this machine's
// physical memory); else ResourceExhausted naming the estimate and the
// limit.
absl::Status CheckMemoryLimit(const MemoryEstimate& estimate,
                              const PlanOptions& options);

}  // namespace trainyard

#endif  // TRAINYARD_PLAN_MEMORY_ESTIMATE_H_
