// The size limits on a spec (job_plan.h, docs/SPEC.md "Limits"), checked
// before anything else so that an oversized spec is not looked at further.
#ifndef TRAINYARD_PLAN_SPEC_LIMITS_H_
#define TRAINYARD_PLAN_SPEC_LIMITS_H_

#include "plan/problems.h"
#include "proto/job_spec.pb.h"

namespace trainyard {

// Adds a problem, naming the field and the limit, for every limit `spec` is
// over: its serialized size, each string's length, the number of blocks and
// list entries, and task.config's size and nesting.
void CheckSizeLimits(const trainyard::v1::JobSpec& spec, Problems* p);

}  // namespace trainyard

#endif  // TRAINYARD_PLAN_SPEC_LIMITS_H_
