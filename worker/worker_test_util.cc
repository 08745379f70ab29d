#include "worker/worker_test_util.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/local_job.h"
#include "engine/test_paths.h"
#include "kernels/exec_context.h"
#include "plan/job_plan.h"
#include "transport/transport.h"

namespace trainyard {
namespace testing {

using ::trainyard::v1::ControllerMessage;
using ::trainyard::v1::JobSpec;

JobSpec SmallSpec(int64_t steps) {
  JobSpec spec;
  spec.set_name("worker-test");
  spec.set_steps(steps);
  spec.set_seed(11);
  for (int out : {16, 4}) {
    auto* block = spec.mutable_model()->add_blocks();
    block->set_out_features(out);
    block->set_ffn_hidden_size(24);
    block->set_activation("gelu");
    block->set_norm("layernorm");
  }
  spec.mutable_parallelism()->set_microbatches(2);
  spec.mutable_optimizer()->set_lr(3e-3);
  spec.mutable_task()->set_plugin("cross_entropy");
  auto* data = spec.mutable_data();
  auto* syn = data->mutable_train()->mutable_synthetic();
  syn->set_kind("gaussian_blobs");
  syn->set_num_samples(200);
  syn->set_num_features(8);
  syn->set_num_outputs(4);
  syn->set_noise(1.0);
  data->set_eval_fraction(0.2);
  data->set_batch_size(16);
  data->set_shuffle(true);
  data->set_eval_every(3);
  return spec;
}

ControllerMessage Assign(const std::string& job_id, const JobSpec& spec,
                         int stage, const std::vector<std::string>& peers) {
  ControllerMessage m;
  auto* a = m.mutable_assign();
  a->set_job_id(job_id);
  a->set_rank(stage);
  *a->mutable_spec() = spec;
  for (const auto& p : peers) a->add_peer_addresses(p);
  return m;
}

void SetPlacements(ControllerMessage* m,
                   const std::vector<std::string>& devices) {
  for (const std::string& d : devices) {
    auto* p = m->mutable_assign()->add_placements();
    p->set_host("host-a");
    p->set_device(d);
  }
}

ControllerMessage Cancel(const std::string& job_id, const std::string& reason) {
  ControllerMessage m;
  m.mutable_cancel()->set_job_id(job_id);
  m.mutable_cancel()->set_reason(reason);
  return m;
}

WorkerOptions TestOptions(const std::string& controller) {
  WorkerOptions options;
  options.controller = controller;
  options.plugin_dir = PluginDir();
  options.data_dir = TempDir();
  options.threads = 1;
  options.name = "test-worker";
  options.health_listen = "";
  options.min_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  options.stage_timeout = absl::Seconds(20);
  options.peer_address = "127.0.0.1:1";
  options.connect_transport = [](const std::string&, int,
                                 const std::vector<std::string>&,
                                 const std::string&, const std::atomic<bool>*)
      -> absl::StatusOr<std::unique_ptr<Transport>> {
    return absl::UnimplementedError("no transport in this test");
  };
  return options;
}

std::vector<double> LocalLosses(const JobSpec& spec) {
  PlanOptions plan_options;
  plan_options.base_dir = TempDir();
  absl::StatusOr<JobPlan> plan = PlanJob(spec, plan_options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  std::vector<double> losses;
  if (!plan.ok()) return losses;
  LocalJobOptions options;
  options.plugin_dir = PluginDir();
  options.threads = 1;
  options.on_step = [&](const StepReport& r, double) {
    losses.push_back(r.loss);
  };
  absl::Status status = RunLocalJob(*plan, options);
  EXPECT_TRUE(status.ok()) << status;
  return losses;
}

bool CudaDeviceUsable() {
  return ExecContext::Create(Device::Cuda(0), Precision::kFp32).ok();
}

WorkerOptions GpuOptions(const std::string& controller, int index) {
  WorkerOptions options = TestOptions(controller);
  options.name = absl::StrCat("gpu", index);
  options.device = absl::StrCat("cuda:", index);
  options.check_device = false;
  return options;
}

std::vector<v1::StageTransport> TransportReports(FakeController& controller,
                                                 const std::string& job_id) {
  std::vector<v1::StageTransport> out;
  for (const Heard& h : controller.heard()) {
    if (h.message.has_transport() && h.message.transport().job_id() == job_id) {
      out.push_back(h.message.transport());
    }
  }
  return out;
}

}  // namespace testing
}  // namespace trainyard
