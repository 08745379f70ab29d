// The memory a planned job is estimated to need (docs/SPEC.md, "Memory"),
// and the check against the limit.
#ifndef TRAINYARD_PLAN_MEMORY_ESTIMATE_H_
#define TRAINYARD_PLAN_MEMORY_ESTIMATE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "plan/data_check.h"
#include "plan/job_plan.h"
#include "plan/problems.h"

namespace trainyard {

// The resident memory the first stage keeps for the job's data, at most:
// sources held in memory whole (npy pairs, synthetic), and for a sharded
// training source the read-ahead's buffers (kReadAheadBatches + 1 batches,
// this replica's part of each, features as float32) plus the file pages
// one read maps (each row's pages and the kernel's 64 KiB fault-around).
struct DataMemory {
  uint64_t in_memory = 0;
  uint64_t read_ahead = 0;
  uint64_t mapped = 0;
  uint64_t total = 0;
};
DataMemory EstimateDataMemory(const JobPlan& plan, const DataInfo& data);

// Adds a problem at data.memory_limit_mib when it is negative or `memory`
// does not fit in it (0: kDefaultDataMemoryLimitMib), naming what the data
// needs.
void CheckDataMemory(const JobPlan& plan, const DataMemory& memory,
                     Problems* p);

// The estimate for a placed plan whose data sources take `data_bytes`.
MemoryEstimate EstimateMemory(const JobPlan& plan, uint64_t data_bytes);

// OK when `estimate` fits options.memory_limit_bytes (0: this machine's
// physical memory); else ResourceExhausted naming the estimate and the
// limit.
absl::Status CheckMemoryLimit(const MemoryEstimate& estimate,
                              const PlanOptions& options);

}  // namespace trainyard

#endif  // TRAINYARD_PLAN_MEMORY_ESTIMATE_H_
