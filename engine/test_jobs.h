// Test helpers: a small classification job that exercises every block kind,
// and a runner that collects its losses and final parameters.
#ifndef TRAINYARD_ENGINE_TEST_JOBS_H_
#define TRAINYARD_ENGINE_TEST_JOBS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/device.h"
#include "engine/stage.h"
#include "engine/test_paths.h"
#include "kernels/exec_context.h"
#include "proto/job_spec.pb.h"

namespace trainyard {
namespace testing {

struct RunResult {
  absl::Status status;
  std::vector<double> losses;
  std::vector<double> grad_norms;
  std::vector<std::pair<int64_t, double>> eval_loss;
  // Final parameters (host copies) by name.
  std::map<std::string, std::vector<float>> params;
  // [stage][step]: each stage's host<->device traffic in each step
  // (replica 0's stages), and its whole report.
  std::vector<std::vector<DeviceTraffic>> traffic;
  std::vector<std::vector<StepReport>> stage_reports;
};

// 4 blocks mixing every activation and norm, so stage splits cut through
// all kinds of blocks; 30 steps of AdamW with clipping and warmup-cosine on
// gaussian blobs (cross_entropy).
trainyard::v1::JobSpec ClassificationSpec();
// ClassificationSpec with 4 more residual blocks before the last: 8 blocks,
// so 4 stages can hold 2 model chunks each.
trainyard::v1::JobSpec DeepClassificationSpec();

// A regression job wide enough that one microbatch's activations (16 rows x
// 128 features) dwarf a step's small numbers: MSE, 4 blocks (pre-LayerNorm,
// GELU tanh, residual in the middle), 4 microbatches of 16 rows, 6 steps,
// bf16, `stages` stages.
trainyard::v1::JobSpec WideRegressionSpec(int stages);

trainyard::v1::JobSpec WithPipeline(trainyard::v1::JobSpec spec, int stages,
                                    int microbatches, const char* schedule);

// A regression data set whose float32 features are exactly `half` values
// (DType::kFloat16 or kBFloat16), written into `dir` twice: as one float32
// pair x.npy / y.npy, and as shard pairs xh-<k>.npy / yh-<k>.npy of
// `shard_rows` rows whose features are stored at half width (float16 '<f2',
// or bfloat16 words '<u2'). Features [rows, features] (random signs and
// mantissas in [1/8, 2)), targets float32 [rows, outputs]; fixed seeds.
void WriteHalfWidthData(const std::string& dir, DType half, int64_t rows,
                        int64_t features, int64_t outputs, int64_t shard_rows);
// `spec` reading WriteHalfWidthData's float32 pair, or its half-width
// shards (with features_dtype set for bfloat16); no eval.
trainyard::v1::JobSpec WithFloat32Pair(trainyard::v1::JobSpec spec,
                                       const std::string& dir);
trainyard::v1::JobSpec WithHalfWidthShards(trainyard::v1::JobSpec spec,
                                           const std::string& dir, DType half);

// Plans and runs `spec` in this process on `device` (the spec's device kind
// is set to match).
// `host_loss` and `device_data_bytes`: LocalJobOptions'.
RunResult RunJob(const trainyard::v1::JobSpec& spec, int64_t stop_after = 0,
                 const std::string& plugin_dir = PluginDir(),
                 Device device = Device::Cpu(), bool host_loss = false,
                 int64_t device_data_bytes = -1);

}  // namespace testing
}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_TEST_JOBS_H_
