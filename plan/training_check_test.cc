// The problems PlanJob finds in how a spec trains: the optimizer, its
// decay mask and lr schedule, the task plugin and checkpoints.
#include <limits>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "plan/job_plan.h"
#include "plan/plan_test_util.h"

namespace trainyard {
namespace plan_test {
namespace {

using trainyard::v1::JobSpec;

TEST(PlanJobErrorsTest, OptimizerTypeAndLr) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_type("lamb");
  spec.mutable_optimizer()->set_lr(0);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "optimizer.type: must be one of \"adamw\", \"sgd\", got "
                "\"lamb\"");
  ExpectProblem(plan, "optimizer.lr: must be > 0 and finite, got 0");
  spec.mutable_optimizer()->set_type("adamw");
  spec.mutable_optimizer()->set_lr(std::numeric_limits<double>::infinity());
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.lr: must be > 0 and finite, got inf");
}

TEST(PlanJobErrorsTest, AdamwHyperparameters) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_beta1(1.0);
  spec.mutable_optimizer()->set_beta2(-0.1);
  spec.mutable_optimizer()->set_eps(0);
  spec.mutable_optimizer()->set_weight_decay(-0.5);
  spec.mutable_optimizer()->set_clip_grad(-1);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "optimizer.beta1: must be in [0, 1), got 1");
  ExpectProblem(plan, "optimizer.beta2: must be in [0, 1), got -0.1");
  ExpectProblem(plan, "optimizer.eps: must be > 0 and finite, got 0");
  ExpectProblem(plan,
                "optimizer.weight_decay: must be >= 0 and finite, got -0.5");
  ExpectProblem(plan, "optimizer.clip_grad: must be >= 0 and finite, got -1");
}

TEST(PlanJobErrorsTest, FieldsOfTheOtherOptimizer) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_momentum(0.9);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.momentum: only for sgd");
  spec.mutable_optimizer()->set_momentum(0);
  spec.mutable_optimizer()->set_type("sgd");
  spec.mutable_optimizer()->set_beta1(0.9);
  spec.mutable_optimizer()->set_eps(1e-6);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "optimizer.beta1: only for adamw");
  ExpectProblem(plan, "optimizer.eps: only for adamw");
}

TEST(PlanJobErrorsTest, SgdMomentumAndNesterov) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_type("sgd");
  spec.mutable_optimizer()->set_nesterov(true);
  spec.mutable_optimizer()->set_dampening(0.5);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.nesterov: requires momentum > 0 and dampening == 0 "
                "(as torch.optim.SGD), got momentum 0, dampening 0.5");
  spec.mutable_optimizer()->set_nesterov(false);
  spec.mutable_optimizer()->set_momentum(-0.9);
  spec.mutable_optimizer()->set_dampening(2);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "optimizer.momentum: must be >= 0 and finite, got -0.9");
  ExpectProblem(plan, "optimizer.dampening: must be in [0, 1], got 2");
}

TEST(PlanJobErrorsTest, DecayMaskAndPatterns) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_decay_mask("biases");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.decay_mask: must be one of \"default\", \"all\", "
                "\"patterns\", got \"biases\"");
  spec.mutable_optimizer()->set_decay_mask("all");
  spec.mutable_optimizer()->add_no_decay("*.bias");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.no_decay: only for decay_mask \"patterns\", got "
                "decay_mask \"all\"");
  spec.mutable_optimizer()->set_decay_mask("patterns");
  spec.mutable_optimizer()->add_no_decay("blocks.*.fc3.bias");
  spec.mutable_optimizer()->add_no_decay("blocks.[0].bias");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "optimizer.no_decay[1]: pattern \"blocks.*.fc3.bias\" "
                "matches no parameter");
  ExpectProblem(plan,
                "optimizer.no_decay[2]: must be a non-empty glob of "
                "[A-Za-z0-9_.*], got \"blocks.[0].bias\"");
  spec.mutable_optimizer()->clear_no_decay();
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.no_decay: decay_mask \"patterns\" needs at least "
                "one pattern");
}

TEST(PlanJobErrorsTest, LrSchedule) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  auto* sched = spec.mutable_optimizer()->mutable_schedule();
  sched->set_type("step");
  sched->set_warmup_steps(-1);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "optimizer.schedule.type: must be one of \"constant\", "
                "\"cosine\", \"linear\", got \"step\"");
  ExpectProblem(plan, "optimizer.schedule.warmup_steps: must be >= 0, got -1");
  sched->set_type("cosine");
  sched->set_warmup_steps(100);
  sched->set_min_lr(0.01);  // lr is 0.001
  plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "optimizer.schedule.warmup_steps: must be < total steps (100) "
                "when decaying, got 100");
  ExpectProblem(plan,
                "optimizer.schedule.min_lr: must be in [0, lr] = [0, 0.001], "
                "got 0.01");
  sched->set_type("constant");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "optimizer.schedule.min_lr: only for schedule type \"cosine\" "
                "or \"linear\", got \"constant\"");
}

TEST(PlanJobErrorsTest, TaskPlugin) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_task()->set_plugin("../evil");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "task.plugin: must match [A-Za-z0-9_]+, got \"../evil\"");
  spec.mutable_task()->clear_plugin();
  ExpectProblem(PlanJob(spec, Options(dir)), "task.plugin: required");
}

TEST(PlanJobErrorsTest, Checkpoint) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  auto* ckpt = spec.mutable_checkpoint();
  ckpt->set_every(10);
  ckpt->set_keep_last(-1);
  ckpt->set_resume("newest");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "checkpoint.every: needs checkpoint.dir");
  ExpectProblem(plan, "checkpoint.keep_last: must be >= 0, got -1");
  ExpectProblem(plan,
                "checkpoint.resume: must be one of \"never\", \"latest\", "
                "got \"newest\"");
  ckpt->set_dir("ck");
  ckpt->set_every(-5);
  ckpt->set_keep_last(0);
  ckpt->set_resume("latest");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "checkpoint.every: must be >= 0, got -5");
}

}  // namespace
}  // namespace plan_test
}  // namespace trainyard
