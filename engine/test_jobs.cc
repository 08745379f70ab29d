#include "engine/test_jobs.h"

#include "absl/synchronization/mutex.h"
#include "engine/local_job.h"
#include "plan/job_plan.h"

namespace trainyard {
namespace testing {

trainyard::v1::JobSpec ClassificationSpec() {
  trainyard::v1::JobSpec spec;
  spec.set_name("engine-test");
  spec.set_steps(30);
  spec.set_seed(7);
  auto* model = spec.mutable_model();
  struct B {
    int out, ffn;
    const char* act;
    const char* norm;
    bool residual;
  };
  for (B b : {B{24, 40, "gelu", "layernorm", false},
              B{24, 32, "swiglu", "rmsnorm", true},
              B{24, 48, "gelu_tanh", "none", true},
              B{5, 16, "relu", "layernorm", false}}) {
    auto* blk = model->add_blocks();
    blk->set_out_features(b.out);
    blk->set_ffn_hidden_size(b.ffn);
    blk->set_activation(b.act);
    blk->set_norm(b.norm);
    blk->set_residual(b.residual);
  }
  auto* par = spec.mutable_parallelism();
  par->set_stages(1);
  par->set_microbatches(4);
  par->set_schedule("1f1b");
  auto* opt = spec.mutable_optimizer();
  opt->set_type("adamw");
  opt->set_lr(3e-3);
  opt->set_weight_decay(0.05);
  opt->set_clip_grad(0.5);
  opt->mutable_schedule()->set_type("cosine");
  opt->mutable_schedule()->set_warmup_steps(5);
  opt->mutable_schedule()->set_min_lr(1e-4);
  spec.mutable_task()->set_plugin("cross_entropy");
  auto* data = spec.mutable_data();
  auto* syn = data->mutable_train()->mutable_synthetic();
  syn->set_kind("gaussian_blobs");
  syn->set_num_samples(400);
  syn->set_num_features(12);
  syn->set_num_outputs(5);
  syn->set_noise(1.0);
  data->set_eval_fraction(0.2);
  data->set_batch_size(32);
  data->set_shuffle(true);
  data->set_eval_every(10);
  return spec;
}

trainyard::v1::JobSpec DeepClassificationSpec() {
  trainyard::v1::JobSpec spec = ClassificationSpec();
  auto* blocks = spec.mutable_model()->mutable_blocks();
  const trainyard::v1::BlockSpec head = blocks->Get(blocks->size() - 1);
  const char* acts[] = {"gelu", "relu", "swiglu", "gelu_tanh"};
  const char* norms[] = {"rmsnorm", "none", "layernorm", "none"};
  for (int i = 0; i < 4; ++i) {
    trainyard::v1::BlockSpec* b =
        i == 0 ? blocks->Mutable(blocks->size() - 1) : blocks->Add();
    *b = trainyard::v1::BlockSpec();
    b->set_out_features(24);
    b->set_ffn_hidden_size(16 + 8 * i);
    b->set_activation(acts[i]);
    b->set_norm(norms[i]);
    b->set_residual(true);
  }
  *blocks->Add() = head;
  return spec;
}

trainyard::v1::JobSpec WideRegressionSpec(int stages) {
  trainyard::v1::JobSpec spec;
  spec.set_name("wide-regression");
  spec.set_steps(6);
  spec.set_seed(11);
  spec.set_precision("bf16");
  for (int i = 0; i < 4; ++i) {
    auto* b = spec.mutable_model()->add_blocks();
    b->set_out_features(i == 3 ? 32 : 128);
    b->set_ffn_hidden_size(256);
    b->set_activation("gelu_tanh");
    b->set_norm("layernorm");
    b->set_residual(i > 0 && i < 3);
  }
  auto* par = spec.mutable_parallelism();
  par->set_stages(stages);
  par->set_microbatches(4);
  par->set_schedule("1f1b");
  auto* opt = spec.mutable_optimizer();
  opt->set_type("adamw");
  opt->set_lr(1e-3);
  opt->set_clip_grad(1.0);
  spec.mutable_task()->set_plugin("mse");
  auto* data = spec.mutable_data();
  auto* syn = data->mutable_train()->mutable_synthetic();
  syn->set_kind("teacher_regression");
  syn->set_num_samples(512);
  syn->set_num_features(128);
  syn->set_num_outputs(32);
  syn->set_noise(0.1);
  data->set_batch_size(64);
  data->set_shuffle(true);
  return spec;
}

RunResult RunJob(const trainyard::v1::JobSpec& spec_in, int64_t stop_after,
                 const std::string& plugin_dir, Device device, bool host_loss,
                 int64_t device_data_bytes) {
  RunResult result;
  trainyard::v1::JobSpec spec = spec_in;
  spec.set_device(device.KindName());
  PlanOptions plan_options;
  absl::StatusOr<JobPlan> plan = PlanJob(spec, plan_options);
  if (!plan.ok()) {
    result.status = plan.status();
    return result;
  }
  absl::Mutex mu;
  LocalJobOptions options;
  options.device = device;
  options.plugin_dir = plugin_dir;
  options.threads = 1;
  options.stop_after_step = stop_after;
  options.host_loss = host_loss;
  options.device_data_bytes = device_data_bytes;
  options.timeout = absl::Seconds(30);
  options.on_step = [&](const StepReport& r, double) {
    result.losses.push_back(r.loss);
    result.grad_norms.push_back(r.grad_norm);
  };
  options.on_eval = [&](int64_t step, const EvalReport& r) {
    result.eval_loss.push_back({step, r.loss});
  };
  result.traffic.resize(plan->num_stages());
  result.stage_reports.resize(plan->num_stages());
  options.on_stage_step = [&](int replica, int stage, const StepReport& r,
                              double) {
    if (replica != 0) return;
    absl::MutexLock lock(&mu);
    result.traffic[stage].push_back(r.traffic);
    result.stage_reports[stage].push_back(r);
  };
  options.on_final_params = [&](int, const auto& params) {
    absl::MutexLock lock(&mu);
    for (const auto& [name, t] : params) {
      const float* p = t.template data<float>();
      result.params[name].assign(p, p + t.numel());
    }
  };
  result.status = RunLocalJob(*plan, options);
  return result;
}

trainyard::v1::JobSpec WithPipeline(trainyard::v1::JobSpec spec, int stages,
                                    int microbatches, const char* schedule) {
  spec.mutable_parallelism()->set_stages(stages);
  spec.mutable_parallelism()->set_microbatches(microbatches);
  spec.mutable_parallelism()->set_schedule(schedule);
  return spec;
}

}  // namespace testing
}  // namespace trainyard
