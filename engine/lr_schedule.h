// LearningRate: the learning rate a job uses at each optimizer step, from its
// OptimizerSpec (lr + schedule). docs/SPEC.md states the same formulas.
//
// For 0-based step s, base rate lr, warmup W, total T, floor min_lr:
//   s < W:       lr * (s + 1) / W                      (linear warmup from 0)
//   otherwise:   p = clamp((s - W) / max(1, T - W), 0, 1)
//     constant:  lr
//     cosine:    min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * p))
//     linear:    lr + (min_lr - lr) * p
//
// The spec must be normalized and valid (PlanJob does both; in particular
// schedule.type and schedule.total_steps are filled in). Pure function;
// thread-safe.
#ifndef TRAINYARD_ENGINE_LR_SCHEDULE_H_
#define TRAINYARD_ENGINE_LR_SCHEDULE_H_

#include <cstdint>

#include "proto/job_spec.pb.h"

namespace trainyard {

// The learning rate for 0-based optimizer step `step` (>= 0). An empty
// schedule type means "constant"; total_steps 0 means no decay horizon
// (progress stays 0, i.e. the rate stays lr after warmup). CHECK-fails on an
// unknown schedule type (PlanJob rejects those first).
double LearningRate(const trainyard::v1::OptimizerSpec& opt, int64_t step);

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_LR_SCHEDULE_H_
