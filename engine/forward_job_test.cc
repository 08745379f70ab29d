// Infer and eval jobs in one process (stages and replicas as threads):
// their outputs against the training job that wrote the checkpoint, bitwise
// across stage counts, replica counts and schedules, resumed from their
// complete shards, and their refusals.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/npy.h"
#include "core/safetensors.h"
#include "engine/checkpoint_store.h"
#include "engine/local_job.h"
#include "engine/test_jobs.h"
#include "engine/test_paths.h"
#include "gtest/gtest.h"
#include "plan/job_plan.h"

namespace trainyard {
namespace {

using trainyard::v1::JobSpec;

std::string TempDir(const std::string& name) {
  const std::string dir = JoinPath(::testing::TempDir(), name);
  std::filesystem::remove_all(dir);
  return dir;
}

absl::Status RunSpec(JobSpec spec, LocalJobOptions options = {}) {
  spec.set_device(options.device.KindName());
  absl::StatusOr<JobPlan> plan = PlanJob(spec, PlanOptions());
  if (!plan.ok()) return plan.status();
  if (options.plugin_dir.empty()) options.plugin_dir = testing::PluginDir();
  return RunLocalJob(*plan, options);
}

// The training job whose checkpoint the tests read: ClassificationSpec on 3
// stages, a checkpoint after the last step, and the last eval's report.
struct Trained {
  std::string checkpoint_dir;
  int64_t step = 0;
  EvalReport final_eval;
};

const Trained& TrainedModel() {
  static const Trained* trained = [] {
    auto* t = new Trained;
    JobSpec spec =
        testing::WithPipeline(testing::ClassificationSpec(), 3, 4, "1f1b");
    t->checkpoint_dir = TempDir("trained");
    spec.mutable_checkpoint()->set_dir(t->checkpoint_dir);
    LocalJobOptions options;
    options.on_eval = [t](int64_t step, const EvalReport& r) {
      t->step = step;
      t->final_eval = r;
    };
    absl::Status st = RunSpec(spec, options);
    EXPECT_TRUE(st.ok()) << st;
    return t;
  }();
  return *trained;
}

// The training spec as a forward-only job of `kind` over its eval rows.
JobSpec ForwardSpec(const char* kind, int stages, int replicas,
                    const std::string& output_dir) {
  JobSpec spec = testing::ClassificationSpec();
  spec.set_kind(kind);
  spec.clear_steps();
  spec.clear_optimizer();
  spec.mutable_data()->set_shuffle(false);
  spec.mutable_data()->set_eval_every(0);
  spec.mutable_parallelism()->set_stages(stages);
  spec.mutable_parallelism()->set_replicas(replicas);
  spec.mutable_inference()->set_checkpoint_dir(TrainedModel().checkpoint_dir);
  if (!output_dir.empty()) {
    spec.mutable_inference()->set_output_dir(output_dir);
    spec.mutable_inference()->set_shard_rows(24);  // 80 rows: 4 shards
  }
  return spec;
}

std::string ReadBytes(const std::string& path) {
  absl::StatusOr<std::string> s = ReadFileToString(path);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

// Every shard file's bytes by relative path.
std::map<std::string, std::string> ShardFiles(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string rel = e.path().lexically_relative(dir).string();
    if (e.is_regular_file() && rel.rfind("shard-", 0) == 0) {
      out[rel] = ReadBytes(e.path().string());
    }
  }
  return out;
}

TEST(ForwardJobTest, EvalJobEqualsTheTrainingJobsLastEvalBitwise) {
  const Trained& trained = TrainedModel();
  // (stages, replicas): the last replica evaluates, the others idle.
  for (auto [stages, replicas] :
       {std::pair{1, 1}, std::pair{2, 1}, std::pair{3, 1}, std::pair{2, 2}}) {
    std::vector<std::pair<int64_t, EvalReport>> evals;
    LocalJobOptions options;
    options.on_eval = [&](int64_t step, const EvalReport& r) {
      evals.push_back({step, r});
    };
    absl::Status st =
        RunSpec(ForwardSpec("eval", stages, replicas, ""), options);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(evals.size(), 1u);
    EXPECT_EQ(evals[0].first, trained.step);
    EXPECT_EQ(evals[0].second.samples, trained.final_eval.samples);
    EXPECT_EQ(evals[0].second.loss, trained.final_eval.loss)
        << "stages " << stages;
    EXPECT_EQ(evals[0].second.metrics, trained.final_eval.metrics);
  }
}

TEST(ForwardJobTest, PredictionsAreBitwiseTheSameForAnyLayout) {
  const Trained& trained = TrainedModel();
  std::map<std::string, std::string> reference;
  struct Layout {
    int stages, replicas;
    const char* schedule;  // chunks: the schedule's default
  };
  for (Layout l :
       {Layout{1, 1, "1f1b"}, Layout{1, 2, "1f1b"}, Layout{2, 1, "1f1b"},
        Layout{2, 2, "gpipe"}, Layout{3, 1, "1f1b"}, Layout{3, 2, "1f1b"},
        Layout{2, 1, "interleaved"}, Layout{2, 1, "zbv"}}) {
    const std::string out = TempDir(
        absl::StrCat("infer-", l.stages, "-", l.replicas, "-", l.schedule));
    std::vector<int64_t> shards;
    std::mutex mu;  // replicas' last stages call on_shard concurrently
    LocalJobOptions options;
    options.on_shard = [&](int64_t shard, int64_t, double) {
      std::lock_guard<std::mutex> lock(mu);
      shards.push_back(shard);
    };
    JobSpec spec = ForwardSpec("infer", l.stages, l.replicas, out);
    spec.mutable_parallelism()->set_schedule(l.schedule);
    absl::Status st = RunSpec(spec, options);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(shards.size(), 4u);
    std::map<std::string, std::string> files = ShardFiles(out);
    ASSERT_EQ(files.size(), 8u);  // 4 shards x 2 outputs
    if (reference.empty()) {
      reference = files;
    } else {
      EXPECT_TRUE(files == reference) << l.stages << " stages, " << l.replicas
                                      << " replicas, " << l.schedule;
    }
  }
  // The predicted classes score what the training job's eval scored.
  absl::StatusOr<JobPlan> plan =
      PlanJob(ForwardSpec("infer", 1, 1, "/x"), PlanOptions());
  ASSERT_TRUE(plan.ok());
  const std::string out = JoinPath(::testing::TempDir(), "infer-1-1-1f1b");
  int64_t correct = 0, rows = 0;
  // The eval rows are the last 20% of the synthetic train rows.
  absl::StatusOr<Dataset> data =
      LoadDataSource(plan->spec.data().train(), "", plan->spec.data().seed());
  ASSERT_TRUE(data.ok());
  const int64_t first = data->num_rows() - 80;
  for (int k = 0; k < 4; ++k) {
    absl::StatusOr<Tensor> pred = ReadNpy(
        JoinPath(out, absl::StrCat("shard-0000", k, "/predicted_class.npy")));
    ASSERT_TRUE(pred.ok()) << pred.status();
    for (int64_t i = 0; i < pred->dim(0); ++i, ++rows) {
      correct += pred->data<int64_t>()[i] ==
                 data->targets.data<int64_t>()[first + rows];
    }
  }
  ASSERT_EQ(rows, 80);
  double accuracy = -1;
  for (const auto& [name, v] : trained.final_eval.metrics) {
    if (name == "accuracy") accuracy = v;
  }
  EXPECT_EQ(static_cast<double>(correct) / rows, accuracy);
}

// The device data path (the simulated device): the data set kept and
// gathered on the device, outputs copied back per microbatch. fp32 computes
// the CPU's bits; bf16 stays within its rounding of them.
TEST(ForwardJobTest, OnTheSimulatedDevice) {
  const std::string cpu = TempDir("sim-reference");
  ASSERT_TRUE(RunSpec(ForwardSpec("infer", 2, 1, cpu)).ok());
  LocalJobOptions on_sim;
  on_sim.device = Device::Sim(0);
  const std::string fp32 = TempDir("sim-fp32");
  absl::Status st = RunSpec(ForwardSpec("infer", 2, 1, fp32), on_sim);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(ShardFiles(fp32) == ShardFiles(cpu));

  const std::string bf16 = TempDir("sim-bf16");
  JobSpec spec = ForwardSpec("infer", 2, 1, bf16);
  spec.set_precision("bf16");
  st = RunSpec(spec, on_sim);
  ASSERT_TRUE(st.ok()) << st;
  for (int k = 0; k < 4; ++k) {
    const std::string file =
        absl::StrCat("shard-0000", k, "/probabilities.npy");
    absl::StatusOr<Tensor> want = ReadNpy(JoinPath(cpu, file));
    absl::StatusOr<Tensor> got = ReadNpy(JoinPath(bf16, file));
    ASSERT_TRUE(want.ok() && got.ok());
    ASSERT_EQ(want->shape(), got->shape());
    double max_diff = 0;
    for (int64_t i = 0; i < want->numel(); ++i) {
      max_diff = std::max<double>(
          max_diff, std::fabs(want->data<float>()[i] - got->data<float>()[i]));
    }
    EXPECT_LT(max_diff, 0.05) << file;  // probabilities, bf16 activations
  }

  // An eval job on the device: its loss slots read once per batch.
  std::vector<EvalReport> evals;
  on_sim.on_eval = [&](int64_t, const EvalReport& r) { evals.push_back(r); };
  st = RunSpec(ForwardSpec("eval", 2, 1, ""), on_sim);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(evals[0].loss, TrainedModel().final_eval.loss);
}

// The same model from one safetensors file in PyTorch's layout (every
// parameter of the checkpoint's stage files, nothing else): the same bits.
TEST(ForwardJobTest, AModelFromSafetensorsGivesTheSameOutputs) {
  const Trained& trained = TrainedModel();
  absl::StatusOr<CheckpointManifest> manifest =
      ReadCheckpointManifest(trained.checkpoint_dir, trained.step);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const int stages = static_cast<int>(manifest->stages.size());
  SafetensorsFile model;
  for (int k = 0; k < stages; ++k) {
    absl::StatusOr<SafetensorsFile> file =
        ReadStageFile(trained.checkpoint_dir, trained.step, k, stages);
    ASSERT_TRUE(file.ok()) << file.status();
    for (auto& [name, t] : file->tensors) {
      if (name.rfind("blocks.", 0) == 0) model.tensors.push_back({name, t});
    }
  }
  const std::string path = JoinPath(TempDir("safetensors"), "model.st");
  ASSERT_TRUE(CreateDirectories(Dirname(path)).ok());
  ASSERT_TRUE(WriteSafetensors(path, model).ok());

  const std::string from_checkpoint = TempDir("from-checkpoint");
  ASSERT_TRUE(RunSpec(ForwardSpec("infer", 2, 1, from_checkpoint)).ok());
  const std::string from_file = TempDir("from-safetensors");
  JobSpec spec = ForwardSpec("infer", 2, 1, from_file);
  spec.mutable_inference()->clear_checkpoint_dir();
  spec.mutable_model()->mutable_init()->set_safetensors(path);
  absl::Status st = RunSpec(spec);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(ShardFiles(from_file) == ShardFiles(from_checkpoint));
}

TEST(ForwardJobTest, AResumedJobWritesOnlyTheMissingShards) {
  const std::string out = TempDir("resume");
  ASSERT_TRUE(RunSpec(ForwardSpec("infer", 2, 1, out)).ok());
  const std::map<std::string, std::string> whole = ShardFiles(out);
  // As if killed after shards 0, 1 and 3: shard 2 is missing.
  std::filesystem::remove_all(JoinPath(out, "shard-00002"));
  struct stat before;
  ASSERT_EQ(stat(JoinPath(out, "shard-00000").c_str(), &before), 0);
  std::vector<int64_t> shards;
  std::mutex mu;
  LocalJobOptions options;
  options.on_shard = [&](int64_t shard, int64_t, double) {
    std::lock_guard<std::mutex> lock(mu);
    shards.push_back(shard);
  };
  // Another stage count continues the same outputs.
  absl::Status st = RunSpec(ForwardSpec("infer", 3, 1, out), options);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(shards, std::vector<int64_t>{2});
  EXPECT_TRUE(ShardFiles(out) == whole);
  struct stat after;
  ASSERT_EQ(stat(JoinPath(out, "shard-00000").c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
}

TEST(ForwardJobTest, AFolderOfSomethingElseIsRefusedAndKept) {
  const std::string out = TempDir("foreign");
  ASSERT_TRUE(CreateDirectories(out).ok());
  ASSERT_TRUE(WriteFileAtomically(JoinPath(out, "notes.txt"), "mine").ok());
  absl::Status st = RunSpec(ForwardSpec("infer", 1, 1, out));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find(out), std::string::npos) << st;
  EXPECT_EQ(ReadBytes(JoinPath(out, "notes.txt")), "mine");

  // Another job's outputs: the same folder, another model.
  const std::string other = TempDir("other-job");
  ASSERT_TRUE(RunSpec(ForwardSpec("infer", 1, 1, other)).ok());
  JobSpec spec = ForwardSpec("infer", 1, 1, other);
  spec.mutable_inference()->set_shard_rows(16);
  st = RunSpec(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
}

TEST(ForwardJobTest, ACheckpointOfAnotherModelIsRefusedNamingTheTensor) {
  TrainedModel();
  const std::string out = TempDir("mismatch");
  JobSpec spec = ForwardSpec("infer", 2, 1, out);
  spec.mutable_model()->mutable_blocks(1)->set_ffn_hidden_size(33);
  absl::Status st = RunSpec(spec);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("blocks.1.fc1.weight"), std::string::npos) << st;
  // Refused before the output folder was made.
  EXPECT_FALSE(std::filesystem::exists(out));

  // One block fewer: the checkpoint holds parameters the spec lacks.
  spec = ForwardSpec("eval", 1, 1, "");
  spec.mutable_model()->mutable_blocks()->RemoveLast();
  spec.mutable_model()->mutable_blocks()->Mutable(2)->set_out_features(5);
  spec.mutable_model()->mutable_blocks()->Mutable(2)->set_residual(false);
  st = RunSpec(spec);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("blocks.3."), std::string::npos) << st;
}

TEST(ForwardJobTest, APluginWithoutInferOutputsIsRefusedBeforeAnyRow) {
  TrainedModel();
  const std::string out = TempDir("no-infer-outputs");
  JobSpec spec = ForwardSpec("infer", 2, 1, out);
  spec.mutable_task()->set_plugin("old_layout");  // a table before the hook
  spec.mutable_task()->clear_config();
  LocalJobOptions options;
  options.plugin_dir = testing::PluginDir() + "/testdata";
  absl::Status st = RunSpec(spec, options);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("plugin \"old_layout\" cannot run inference"),
            std::string::npos)
      << st;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(ForwardJobTest, AMissingCheckpointIsNamed) {
  JobSpec spec = ForwardSpec("eval", 1, 1, "");
  const std::string empty = TempDir("no-checkpoints");
  ASSERT_TRUE(CreateDirectories(empty).ok());
  spec.mutable_inference()->set_checkpoint_dir(empty);
  absl::Status st = RunSpec(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("inference.checkpoint_dir: " + empty +
                              " holds no complete checkpoint"),
            std::string::npos)
      << st;
}

TEST(ForwardJobTest, ARowThePluginRefusesFailsTheJobNamingIt) {
  TrainedModel();
  // The eval rows as .npy files, row 37's features not finite.
  JobSpec spec = ForwardSpec("infer", 2, 1, TempDir("bad-row"));
  absl::StatusOr<JobPlan> plan = PlanJob(spec, PlanOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<Dataset> data =
      LoadDataSource(plan->spec.data().train(), "", plan->spec.data().seed());
  ASSERT_TRUE(data.ok()) << data.status();
  Tensor x = data->features.Rows(320, 400).Clone();
  x.data<float>()[37 * x.dim(1) + 2] = std::numeric_limits<float>::quiet_NaN();
  const std::string dir = TempDir("bad-row-data");
  ASSERT_TRUE(CreateDirectories(dir).ok());
  ASSERT_TRUE(WriteNpy(JoinPath(dir, "x.npy"), x).ok());
  ASSERT_TRUE(
      WriteNpy(JoinPath(dir, "y.npy"), data->targets.Rows(320, 400).Clone())
          .ok());
  auto* eval = spec.mutable_data()->mutable_eval()->mutable_npy();
  eval->set_features(JoinPath(dir, "x.npy"));
  eval->set_targets(JoinPath(dir, "y.npy"));
  spec.mutable_data()->clear_eval_fraction();
  absl::Status st = RunSpec(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("data row 37"), std::string::npos) << st;
}

}  // namespace
}  // namespace trainyard
