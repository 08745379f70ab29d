// Checking a spec's model: its blocks against each other and the data, and
// its initial weights.
#ifndef TRAINYARD_PLAN_MODEL_CHECK_H_
#define TRAINYARD_PLAN_MODEL_CHECK_H_

#include "plan/data_check.h"
#include "plan/job_plan.h"
#include "plan/problems.h"

namespace trainyard {

// Checks plan->spec.model, filling in its defaults: block widths (block i's
// input is block i - 1's output, block 0's the data's features; unset
// in_features are filled in), activation and norm names, residual widths,
// the last block's width against the targets, and model.init (seed, and the
// safetensors path made absolute and checked). Appends one MlpBlockConfig
// per block to plan->blocks and sets plan's output_dim, and its feature_dim
// from block 0 when the data's is unknown. True when every block is valid.
bool CheckModel(const DataInfo& data, const PlanOptions& options, Problems* p,
                JobPlan* plan);

}  // namespace trainyard

#endif  // TRAINYARD_PLAN_MODEL_CHECK_H_
