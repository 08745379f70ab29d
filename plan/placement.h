// Placing a checked model on the pipeline: which blocks each virtual stage
// holds, and every parameter with its stage and weight-decay flag.
#ifndef TRAINYARD_PLAN_PLACEMENT_H_
#define TRAINYARD_PLAN_PLACEMENT_H_

#include "plan/job_plan.h"
#include "plan/problems.h"

namespace trainyard {

// Fills in plan's num_chunks, chunk_layout, virtual_stage_begin and params
// from its (valid) blocks, stages, chunks and split; an unset split is
// BalancedSplit's, written back to plan->spec. Adds a problem for each
// valid optimizer.no_decay pattern that matches no parameter.
void PlaceBlocks(Problems* p, JobPlan* plan);

}  // namespace trainyard

#endif  // TRAINYARD_PLAN_PLACEMENT_H_
