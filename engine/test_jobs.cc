#include "engine/test_jobs.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "core/bfloat16.h"
#include "core/file_util.h"
#include "core/npy.h"
#include "engine/local_job.h"
#include "glog/logging.h"
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

void WriteHalfWidthData(const std::string& dir, DType half, int64_t rows,
                        int64_t features, int64_t outputs, int64_t shard_rows) {
  CHECK(CreateDirectories(dir).ok()) << dir;
  std::mt19937 rng(static_cast<uint32_t>(rows * 31 + features));
  // Sign, an exponent for [1/8, 2) and a mantissa, as a float16 or a
  // bfloat16 word; the float32 value is its exact widening.
  std::vector<uint16_t> words(rows * features);
  Tensor x = Tensor::Empty(DType::kFloat32, {rows, features});
  for (size_t i = 0; i < words.size(); ++i) {
    const uint32_t r = rng();
    const uint16_t sign = static_cast<uint16_t>((r & 1u) << 15);
    if (half == DType::kFloat16) {
      words[i] = sign | static_cast<uint16_t>((12 + (r >> 1) % 4) << 10) |
                 static_cast<uint16_t>((r >> 3) & 0x3FF);
      x.data<float>()[i] = Float16ToFloat(words[i]);
    } else {
      words[i] = sign | static_cast<uint16_t>((124 + (r >> 1) % 4) << 7) |
                 static_cast<uint16_t>((r >> 3) & 0x7F);
      x.data<float>()[i] = Bf16ToFloat(words[i]);
    }
  }
  Tensor y = Tensor::Empty(DType::kFloat32, {rows, outputs});
  std::uniform_real_distribution<float> target(-1.0f, 1.0f);
  for (int64_t i = 0; i < rows * outputs; ++i) y.data<float>()[i] = target(rng);
  CHECK(WriteNpy(JoinPath(dir, "x.npy"), x).ok());
  CHECK(WriteNpy(JoinPath(dir, "y.npy"), y).ok());
  for (int64_t begin = 0, k = 0; begin < rows; begin += shard_rows, ++k) {
    const int64_t n = std::min(shard_rows, rows - begin);
    // A float32 header with its descr swapped for the half-width one (the
    // same length, so the data still starts at the header's end).
    absl::StatusOr<std::string> header =
        NpyHeaderBytes(DType::kFloat32, {n, features});
    CHECK(header.ok());
    const std::string descr = half == DType::kFloat16 ? "<f2" : "<u2";
    std::string bytes = absl::StrReplaceAll(*header, {{"<f4", descr}});
    bytes.append(reinterpret_cast<const char*>(&words[begin * features]),
                 n * features * sizeof(uint16_t));
    CHECK(WriteFileAtomically(JoinPath(dir, absl::StrFormat("xh-%05d.npy", k)),
                              bytes)
              .ok());
    CHECK(WriteNpy(JoinPath(dir, absl::StrFormat("yh-%05d.npy", k)),
                   y.Rows(begin, begin + n).Clone())
              .ok());
  }
}

namespace {

// `spec`'s data with no eval set and no evals.
trainyard::v1::DataSpec* DataWithoutEval(trainyard::v1::JobSpec* spec) {
  auto* data = spec->mutable_data();
  data->clear_eval();
  data->set_eval_fraction(0);
  data->set_eval_every(0);
  return data;
}

}  // namespace

trainyard::v1::JobSpec WithFloat32Pair(trainyard::v1::JobSpec spec,
                                       const std::string& dir) {
  auto* npy = DataWithoutEval(&spec)->mutable_train()->mutable_npy();
  npy->set_features(JoinPath(dir, "x.npy"));
  npy->set_targets(JoinPath(dir, "y.npy"));
  return spec;
}

trainyard::v1::JobSpec WithHalfWidthShards(trainyard::v1::JobSpec spec,
                                           const std::string& dir, DType half) {
  auto* shards = DataWithoutEval(&spec)->mutable_train()->mutable_npy_shards();
  shards->add_features(JoinPath(dir, "xh-*.npy"));
  shards->add_targets(JoinPath(dir, "yh-*.npy"));
  if (half == DType::kBFloat16) shards->set_features_dtype("bfloat16");
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
