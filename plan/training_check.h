// Checking how a spec trains: the optimizer with its weight-decay mask and
// learning-rate schedule, the task plugin, checkpoints and recovery.
#ifndef TRAINYARD_PLAN_TRAINING_CHECK_H_
#define TRAINYARD_PLAN_TRAINING_CHECK_H_

#include <string>

#include "plan/job_plan.h"
#include "plan/problems.h"
#include "proto/job_spec.pb.h"

namespace trainyard {

// Checks spec->optimizer (type, lr, the type's hyperparameters, decay_mask
// and no_decay, and its lr schedule), filling in the defaults.
void CheckOptimizer(Problems* p, trainyard::v1::JobSpec* spec);

// An optimizer.no_decay pattern the planner can match: a non-empty glob of
// [A-Za-z0-9_.*].
bool ValidNoDecayPattern(const std::string& pattern);

// task.plugin: required, [A-Za-z0-9_]+.
void CheckTask(const trainyard::v1::JobSpec& spec, Problems* p);

// Checks spec->checkpoint, filling in its defaults; its dir is made
// absolute and must stay inside options.confine_to.
void CheckCheckpoint(const PlanOptions& options, Problems* p,
                     trainyard::v1::JobSpec* spec);

// Checks spec->recovery, filling in its defaults.
void CheckRecovery(Problems* p, trainyard::v1::JobSpec* spec);

}  // namespace trainyard

#endif  // TRAINYARD_PLAN_TRAINING_CHECK_H_
