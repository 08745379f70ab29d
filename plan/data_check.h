// Checking a spec's data: the train and eval sources (.npy files or a
// synthetic generator), how eval data is held out, and the batch settings.
#ifndef TRAINYARD_PLAN_DATA_CHECK_H_
#define TRAINYARD_PLAN_DATA_CHECK_H_

#include <cstdint>

#include "plan/job_plan.h"
#include "plan/problems.h"

namespace trainyard {

// What validation learned about one data source.
struct SourceInfo {
  bool known = false;    // rows/features/targets below are valid
  int64_t rows = 0;      // N
  int64_t features = 0;  // D
  bool class_targets = false;
  int64_t target_width = 0;  // K for float targets; #classes if known, else 0
  uint64_t bytes = 0;        // features + targets as held in memory
};

// What validation learned about the job's data.
struct DataInfo {
  SourceInfo train;
  SourceInfo eval;
  // data.train had a problem of its own (so the model's checks need not
  // report the data's unknown width again).
  bool train_reported = false;
};

// Checks plan->spec.data, filling in its defaults (its seed, and each
// synthetic source's, from the spec's seed), making its paths absolute and,
// with options.check_files, reading the .npy headers. Sets plan's
// feature_dim, class_targets and train_rows from data.train where known.
DataInfo CheckData(const PlanOptions& options, Problems* p, JobPlan* plan);

}  // namespace trainyard

#endif  // TRAINYARD_PLAN_DATA_CHECK_H_
