// PlanJob: the spec's size limits, then each part of the spec in turn
// (every problem collected, in this order), the placement of the blocks,
// and the memory estimate against the limit.
#include "plan/job_plan.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "plan/data_check.h"
#include "plan/inference_check.h"
#include "plan/memory_estimate.h"
#include "plan/model_check.h"
#include "plan/parallelism_check.h"
#include "plan/placement.h"
#include "plan/problems.h"
#include "plan/spec_limits.h"
#include "plan/training_check.h"

namespace trainyard {
namespace {

using trainyard::v1::JobSpec;

// steps (a training job's), and device and precision (filling in their
// defaults).
void CheckRunSettings(Problems* p, JobSpec* s) {
  if (s->kind() == "train" && s->steps() <= 0) {
    p->Add("steps", absl::StrCat("must be > 0, got ", s->steps()));
  }
  if (s->device().empty()) s->set_device("cpu");
  CheckOneOf(p, "device", s->device(), {"cpu", "cuda", "sim"});
  if (s->precision().empty()) s->set_precision("fp32");
  if (!CheckOneOf(p, "precision", s->precision(), {"fp32", "tf32", "bf16"})) {
    return;
  }
  // bf16 runs on GPUs and the simulated device; tf32 only on GPUs.
  const bool ok = s->precision() == "fp32" || s->device() == "cuda" ||
                  (s->precision() == "bf16" && s->device() == "sim");
  if (!ok) {
    p->Add("precision",
           absl::StrCat(s->precision(), " needs device \"cuda\"",
                        s->precision() == "bf16" ? " (or \"sim\")" : "",
                        ", got device ", Quote(s->device()),
                        " (the CPU computes in fp32)"));
  }
}

}  // namespace

absl::StatusOr<JobPlan> PlanJob(const JobSpec& spec,
                                const PlanOptions& options) {
  {
    Problems sizes;
    CheckSizeLimits(spec, &sizes);
    if (!sizes.empty()) return sizes.ToStatus("job spec over the size limits");
  }
  Problems p;
  JobPlan plan;
  plan.spec = spec;
  CheckJobKind(options, &p, &plan);
  CheckRunSettings(&p, &plan.spec);
  const DataInfo data = CheckData(options, &p, &plan);
  const bool blocks_ok = CheckModel(data, options, &p, &plan);
  const bool layout_ok = CheckParallelism(&p, &plan.spec);
  if (plan.trains()) CheckOptimizer(&p, &plan.spec);
  CheckTask(plan.spec, &p);
  if (plan.trains()) CheckCheckpoint(options, &p, &plan.spec);
  CheckRecovery(&p, &plan.spec);
  if (blocks_ok && layout_ok) PlaceBlocks(&p, &plan);
  const DataMemory data_memory = EstimateDataMemory(plan, data);
  CheckDataMemory(plan, data_memory, &p);
  if (!p.empty()) {
    return p.ToStatus(
        absl::StrCat("invalid job spec",
                     spec.name().empty() ? "" : " " + Quote(spec.name())));
  }
  plan.memory = EstimateMemory(plan, data_memory.total);
  absl::Status fits = CheckMemoryLimit(plan.memory, options);
  if (!fits.ok()) return fits;
  return plan;
}

}  // namespace trainyard
