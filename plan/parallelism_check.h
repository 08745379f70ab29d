// Checking a spec's parallelism: stages, schedule and chunks, microbatches,
// accumulation, replicas and the explicit split.
#ifndef TRAINYARD_PLAN_PARALLELISM_CHECK_H_
#define TRAINYARD_PLAN_PARALLELISM_CHECK_H_

#include "plan/problems.h"
#include "proto/job_spec.pb.h"

namespace trainyard {

// Checks spec->parallelism, filling in its defaults, against the model's
// block count and data.batch_size. True when the stages, schedule, chunks
// and split are valid, so that the blocks can be placed (PlaceBlocks).
bool CheckParallelism(Problems* p, trainyard::v1::JobSpec* spec);

}  // namespace trainyard

#endif  // TRAINYARD_PLAN_PARALLELISM_CHECK_H_
