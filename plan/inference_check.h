// Checking a spec's kind ("train", "infer", "eval") and, for the
// forward-only kinds, where their model comes from and where an inference
// job's outputs go (JobSpec.inference), and that they give nothing only a
// training job uses.
#ifndef TRAINYARD_PLAN_INFERENCE_CHECK_H_
#define TRAINYARD_PLAN_INFERENCE_CHECK_H_

#include "plan/job_plan.h"
#include "plan/problems.h"
#include "proto/job_spec.pb.h"

namespace trainyard {

// Checks spec->kind (default "train") and sets plan->kind. For "infer" and
// "eval": the model source (inference.checkpoint_dir or
// model.init.safetensors, exactly one), inference.checkpoint_step,
// inference.output_dir (infer only; made absolute, confined like every
// path) and shard_rows (infer only; default kDefaultShardRows), and that
// steps, optimizer, checkpoint, data.eval_every and data.shuffle are not
// given. For "train": that inference is not given. Returns false when the
// kind itself is unknown (the rest of the spec is then checked as
// training).
bool CheckJobKind(const PlanOptions& options, Problems* p, JobPlan* plan);

}  // namespace trainyard

#endif  // TRAINYARD_PLAN_INFERENCE_CHECK_H_
