#include "engine/task_loader.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "task_plugins/plugin_test_util.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using testing::Int64Tensor;
using testing::LoadPlugin;
using testing::PluginDir;
using testing::RandomFloats;
using ::testing::StartsWith;
using testing::TestdataPluginDir;

constexpr int64_t kB = 4;
constexpr int64_t kD = 3;

NamedTensors Batch() {
  return {{"features", RandomFloats({kB, kD}, 1)},
          {"targets", Int64Tensor({0, 1, 2, 1})}};
}

std::unique_ptr<Task> Misbehaving(const std::string& config) {
  auto plugin = LoadPlugin(TestdataPluginDir(), "misbehaving");
  if (plugin == nullptr) return nullptr;
  absl::StatusOr<std::unique_ptr<Task>> task = Task::Create(plugin, config);
  EXPECT_TRUE(task.ok()) << task.status();
  return task.ok() ? std::move(*task) : nullptr;
}

absl::StatusOr<LossResult> RunLoss(Task* task, const Tensor& output,
                                   const NamedTensors& state, int64_t step = 0,
                                   int32_t mb = 0, int32_t num_mb = 1) {
  Tensor grad = Tensor::Zeros(DType::kFloat32, output.shape());
  return task->ComputeLoss(output, state, &grad, step, mb, num_mb,
                           /*is_eval=*/false);
}

// A fresh folder under the test's scratch folder.
std::string MakeDir(const std::string& name) {
  const std::string dir = testing::TempDir() + "/" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}

// --- Loading -------------------------------------------------------------

TEST(TaskPluginTest, RejectsNamesThatAreNotPlainIdentifiers) {
  for (const std::string name : {"", "../mse", "a/b", "mse.so", "x y"}) {
    auto p = TaskPlugin::Load(PluginDir(), name);
    ASSERT_FALSE(p.ok()) << name;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(
        p.status().message(),
        absl::StrCat("plugin \"", name,
                     "\": invalid plugin name: must match [A-Za-z0-9_]+"));
  }
}

TEST(TaskPluginTest, MissingFileIsNotFound) {
  auto p = TaskPlugin::Load("/nonexistent/plugins", "xent");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(p.status().message(),
            "plugin \"xent\": /nonexistent/plugins/libxent.so: No such file "
            "or directory");
}

TEST(TaskPluginTest, NotAnElfFileIsRefusedBeforeLoading) {
  const std::string dir = testing::TempDir();
  { std::ofstream(dir + "/libgarbage.so") << "not an ELF file"; }
  auto p = TaskPlugin::Load(dir, "garbage");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.status().message(),
            absl::StrCat("plugin \"garbage\": ", dir,
                         "/libgarbage.so is not a task plugin: not an ELF "
                         "file"));
}

TEST(TaskPluginTest, ALibraryWithoutTheSymbolIsNeverLoaded) {
  auto p = TaskPlugin::Load(TestdataPluginDir(), "no_symbol");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(p.status().message(),
            absl::StrCat("plugin \"no_symbol\": symbol trainyard_task_v1 not "
                         "found in ",
                         TestdataPluginDir(),
                         "/libno_symbol.so (not a Trainyard task plugin; it "
                         "was not loaded)"));
  // Its constructor never ran.
  EXPECT_EQ(getenv("TRAINYARD_NO_SYMBOL_LOADED"), nullptr);
}

TEST(TaskPluginTest, AnyOtherSharedLibraryIsRefusedUnloaded) {
  // A real, large shared library (zlib), under a plugin's name: its dynamic
  // symbol table is read and it is refused without being loaded.
  const std::string dir = testing::TempDir();
  {
    std::ifstream in("/lib/x86_64-linux-gnu/libz.so.1", std::ios::binary);
    ASSERT_TRUE(in.good());
    std::ofstream out(dir + "/libzlib.so", std::ios::binary);
    out << in.rdbuf();
  }
  auto p = TaskPlugin::Load(dir, "zlib");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(p.status().message()),
              HasSubstr("not a Trainyard task plugin; it was not loaded"));
  // The shipped plugins still load (their symbol is found the same way).
  EXPECT_TRUE(TaskPlugin::Load(PluginDir(), "mse").ok());
}

TEST(TaskPluginTest, WrongAbiVersionIsRefused) {
  auto p = TaskPlugin::Load(TestdataPluginDir(), "bad_version");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.status().message(),
            absl::StrCat("plugin \"bad_version\": ", TestdataPluginDir(),
                         "/libbad_version.so speaks task ABI version 2, this "
                         "host speaks 1"));
}

TEST(TaskPluginTest, WrongStructSizeIsRefused) {
  auto p = TaskPlugin::Load(TestdataPluginDir(), "bad_struct_size");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.status().message(),
            absl::StrCat("plugin \"bad_struct_size\": ", TestdataPluginDir(),
                         "/libbad_struct_size.so: TrainyardTaskV1 struct_size "
                         "is ",
                         TRAINYARD_TASK_V1_SIZE_CONFINED - sizeof(void*),
                         ", expected ", sizeof(TrainyardTaskV1), " (or ",
                         TRAINYARD_TASK_V1_SIZE_CONFINED,
                         ", the layout before infer_outputs, or ",
                         TRAINYARD_TASK_V1_SIZE_BASE,
                         ", the layout before validate_config)"));
}

TEST(TaskPluginTest, NullRequiredFunctionIsRefused) {
  auto p = TaskPlugin::Load(TestdataPluginDir(), "null_function");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.status().message(),
            absl::StrCat("plugin \"null_function\": ", TestdataPluginDir(),
                         "/libnull_function.so: required function "
                         "TrainyardTaskV1.compute_loss is NULL"));
}

TEST(TaskPluginTest, LoadsShippedPlugin) {
  auto p = TaskPlugin::Load(PluginDir(), "mse");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->name(), "mse");
  EXPECT_EQ((*p)->table_name(), "mse");
  EXPECT_EQ((*p)->path(), PluginDir() + "/libmse.so");
}

// --- Create --------------------------------------------------------------

TEST(TaskTest, CreateRefusingConfigIsInvalidArgument) {
  auto plugin = LoadPlugin(TestdataPluginDir(), "misbehaving");
  ASSERT_NE(plugin, nullptr);
  auto task = Task::Create(plugin, R"({"mode": "refuse"})");
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(task.status().message(),
            "plugin \"misbehaving\": create: config refused on purpose (mode "
            "\"refuse\")");
}

TEST(TaskTest, CreateReturningNullWithoutMessage) {
  auto plugin = LoadPlugin(TestdataPluginDir(), "misbehaving");
  ASSERT_NE(plugin, nullptr);
  auto task = Task::Create(plugin, R"({"mode": "null_without_message"})");
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(task.status().message(),
            "plugin \"misbehaving\": create: returned NULL without a message");
}

TEST(TaskTest, ShippedPluginRefusesUnknownConfigKey) {
  auto plugin = LoadPlugin(PluginDir(), "mse");
  ASSERT_NE(plugin, nullptr);
  auto task = Task::Create(plugin, R"({"reduction": "mean", "typo": 1})");
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      task.status().message(),
      "plugin \"mse\": create: task.config: unknown key \"typo\" (allowed: "
      "reduction)");
}

// --- A well-behaved lifecycle ---------------------------------------------

TEST(TaskTest, FullLifecycle) {
  auto task = Misbehaving(R"({"mode": "ok"})");
  ASSERT_NE(task, nullptr);
  ASSERT_TRUE(task->OnEvent(TRAINYARD_EVENT_STEP_BEGIN, 0, "").ok());
  auto fwd = task->BuildForwardInputs(Batch(), 0, false);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->inputs.shape(), (Shape{kB, kD}));
  ASSERT_EQ(fwd->state.size(), 1u);
  EXPECT_EQ(fwd->state[0].first, "targets");
  EXPECT_EQ(fwd->state[0].second.data<int64_t>()[2], 2);

  // Two microbatches of 2 rows: loss = sum(o^2) / (2 b), grad = o / b.
  Tensor output = RandomFloats({kB, 5}, 7);
  double total = 0;
  for (int mb = 0; mb < 2; ++mb) {
    Tensor out = output.Rows(2 * mb, 2 * mb + 2);
    NamedTensors state = {
        {"targets", fwd->state[0].second.Rows(2 * mb, 2 * mb + 2)}};
    Tensor grad = Tensor::Zeros(DType::kFloat32, {2, 5});
    auto r = task->ComputeLoss(out, state, &grad, 0, mb, 2, false);
    ASSERT_TRUE(r.ok()) << r.status();
    double expect = 0;
    for (int i = 0; i < 10; ++i) {
      const double o = out.data<float>()[i];
      expect += 0.5 * o * o / 2;
      EXPECT_FLOAT_EQ(grad.data<float>()[i], out.data<float>()[i] / 2);
    }
    EXPECT_NEAR(r->loss, expect, 1e-6);
    EXPECT_EQ(r->weight, 2);
    ASSERT_EQ(r->metrics.size(), 1u);
    EXPECT_EQ(r->metrics[0].first, "rows");
    total += r->loss;
  }
  EXPECT_GT(total, 0);
  auto metrics = task->UpdateMetrics(false);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  ASSERT_EQ(metrics->size(), 3u);
  EXPECT_EQ((*metrics)[0], (std::pair<std::string, double>("loss_calls", 2)));
  EXPECT_EQ((*metrics)[1], (std::pair<std::string, double>("events", 1)));

  auto state = task->StateDict();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->size(), 8u);
  ASSERT_TRUE(task->OnEvent(TRAINYARD_EVENT_CHECKPOINT_SAVED, 1, "/ckpt").ok());

  // State round-trips into a fresh task.
  auto other = Misbehaving(R"({"mode": "ok"})");
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(other->LoadStateDict(*state).ok());
  auto restored = other->StateDict();
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ(*restored, *state);
  auto bad_load = other->LoadStateDict("abc");
  EXPECT_EQ(bad_load.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_load.message(),
            "plugin \"misbehaving\": load_state_dict: state must be 8 bytes, "
            "got 3");

  EXPECT_TRUE(task->Finalize().ok());
  // Nothing may be called after finalize (the plugin would fail a second
  // finalize itself; the host must not even get there).
  auto again = task->Finalize();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(again.message(),
            "plugin \"misbehaving\": finalize: called after finalize");
  auto late = task->BuildForwardInputs(Batch(), 1, false);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TaskTest, TaskKeepsPluginLoaded) {
  std::unique_ptr<Task> task;
  {
    auto plugin = LoadPlugin(TestdataPluginDir(), "misbehaving");
    ASSERT_NE(plugin, nullptr);
    auto t = Task::Create(plugin, "");
    ASSERT_TRUE(t.ok()) << t.status();
    task = std::move(*t);
  }  // Our reference to the plugin is gone; the task's keeps it mapped.
  auto fwd = task->BuildForwardInputs(Batch(), 0, false);
  EXPECT_TRUE(fwd.ok()) << fwd.status();
}

TEST(TaskTest, PluginThreadsSurviveUnload) {
  {
    auto task = Misbehaving(R"({"mode": "leave_thread"})");
    ASSERT_NE(task, nullptr);
  }  // Task and plugin handle gone; the plugin's thread is still running.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // Reloading gives the same, still-mapped library.
  auto again = Misbehaving("{}");
  EXPECT_NE(again, nullptr);
}

TEST(TaskTest, StatelessPluginRefusesState) {
  auto plugin = LoadPlugin(PluginDir(), "mse");
  ASSERT_NE(plugin, nullptr);
  auto task = Task::Create(plugin, "{}");
  ASSERT_TRUE(task.ok()) << task.status();
  auto state = (*task)->StateDict();
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(*state, "");
  EXPECT_TRUE((*task)->LoadStateDict("").ok());
  auto s = (*task)->LoadStateDict("xyz");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "plugin \"mse\": load_state_dict: the plugin is stateless but got "
            "3 bytes of state");
  EXPECT_TRUE((*task)->OnEvent(TRAINYARD_EVENT_JOB_END, 3, "done").ok());
  EXPECT_TRUE((*task)->Finalize().ok());
}

// --- Errors and contract violations ----------------------------------------

TEST(TaskTest, ComputeLossErrorMidRun) {
  auto task =
      Misbehaving(R"({"mode": "loss_error_at_step", "fail_at_step": 2})");
  ASSERT_NE(task, nullptr);
  Tensor output = RandomFloats({kB, 2}, 3);
  NamedTensors state;
  for (int64_t step = 0; step < 2; ++step) {
    auto r = RunLoss(task.get(), output, state, step);
    ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status();
  }
  auto r = RunLoss(task.get(), output, state, 2, 1, 3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "plugin \"misbehaving\": compute_loss: injected failure at step 2 "
            "microbatch 1");
}

struct Violation {
  std::string mode;
  std::string call;  // "build", "loss" or "metrics"
  absl::StatusCode code;
  std::string message;
  bool prefix_only = false;  // the message ends with a value not asserted
};

class ViolationTest : public ::testing::TestWithParam<Violation> {};

TEST_P(ViolationTest, IsReportedAsAnError) {
  const Violation& v = GetParam();
  auto task = Misbehaving(absl::StrCat(R"({"mode": ")", v.mode, R"("})"));
  ASSERT_NE(task, nullptr);
  absl::Status status;
  if (v.call == "build") {
    status = task->BuildForwardInputs(Batch(), 0, false).status();
  } else if (v.call == "loss") {
    status =
        RunLoss(task.get(), RandomFloats({kB, 2}, 5), {}, 3, 1, 2).status();
  } else {
    status = task->UpdateMetrics(false).status();
  }
  EXPECT_EQ(status.code(), v.code) << status;
  if (v.prefix_only) {
    EXPECT_THAT(std::string(status.message()), StartsWith(v.message));
  } else {
    EXPECT_EQ(status.message(), v.message);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, ViolationTest,
    ::testing::Values(
        Violation{"missing_inputs", "build", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": build_forward_inputs: did not add "
                  "the required tensor \"inputs\""},
        Violation{"wrong_inputs_rows", "build", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": build_forward_inputs: \"inputs\" "
                  "has 5 rows, the batch has 4"},
        Violation{"inputs_int32", "build", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": build_forward_inputs: \"inputs\" "
                  "must be float32 [B, D], got int32 [4, 3]"},
        Violation{"inputs_rank3", "build", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": build_forward_inputs: \"inputs\" "
                  "must be float32 [B, D], got float32 [4, 3, 1]"},
        Violation{"duplicate_tensor", "build", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": build_forward_inputs: sink misuse: "
                  "duplicate tensor name \"inputs\""},
        Violation{"state_bad_rows", "build", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": build_forward_inputs: state tensor "
                  "\"weights\" has shape [6]; dim 0 must equal the batch size "
                  "4"},
        Violation{"bytes_in_build", "build", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": build_forward_inputs: sink misuse: "
                  "add_bytes is not allowed in this call"},
        Violation{"huge_tensor", "build", absl::StatusCode::kInvalidArgument,
                  "plugin \"misbehaving\": build_forward_inputs: host refused "
                  "the huge tensor (host: sink misuse: add_tensor \"huge\": "
                  "shape [1099511627776, 1048576] exceeds the host's limit of "
                  "4294967296 bytes per tensor / 8589934592 per call)"},
        Violation{"nan_loss", "loss", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": compute_loss: step 3 microbatch 1: "
                  "loss is not finite: nan"},
        Violation{"inf_weight", "loss", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": compute_loss: step 3 microbatch 1: "
                  "loss_weight must be finite and >= 0, got inf"},
        Violation{"negative_weight", "loss", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": compute_loss: step 3 microbatch 1: "
                  "loss_weight must be finite and >= 0, got -1"},
        Violation{"zero_weight_nonzero_loss", "loss",
                  absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": compute_loss: step 3 microbatch 1: "
                  "loss_weight is 0 but loss is ",
                  /*prefix_only=*/true},
        Violation{"nan_grad", "loss", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": compute_loss: step 3 microbatch 1: "
                  "grad_output[3, 1] is not finite: nan"},
        Violation{"tensor_in_loss", "loss", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": compute_loss: sink misuse: "
                  "add_tensor is not allowed in this call"},
        Violation{"throw", "loss", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": compute_loss: threw a C++ "
                  "exception across the ABI: thrown on purpose"},
        Violation{"error_without_message", "loss",
                  absl::StatusCode::kInvalidArgument,
                  "plugin \"misbehaving\": compute_loss: failed without a "
                  "message"},
        Violation{"unterminated_error", "loss",
                  absl::StatusCode::kInvalidArgument,
                  "plugin \"misbehaving\": compute_loss: " +
                      std::string(TRAINYARD_ERROR_LEN - 1, 'x')},
        Violation{"metric_nan", "metrics", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": update_metrics: metric \"bad\" is "
                  "not finite: nan"},
        Violation{"duplicate_metric", "metrics", absl::StatusCode::kInternal,
                  "plugin \"misbehaving\": update_metrics: sink misuse: "
                  "duplicate metric name \"events\""}),
    [](const ::testing::TestParamInfo<Violation>& info) {
      return info.param.mode;
    });

// --- Host-side argument checks ---------------------------------------------

TEST(TaskTest, BatchTensorsMustAgreeOnRows) {
  auto task = Misbehaving("{}");
  ASSERT_NE(task, nullptr);
  NamedTensors batch = {{"features", RandomFloats({4, 3}, 1)},
                        {"targets", Int64Tensor({0, 1, 2})}};
  auto r = task->BuildForwardInputs(batch, 0, false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "plugin \"misbehaving\": build_forward_inputs: batch tensor "
            "\"targets\" has 3 rows, expected 4 like \"features\"");
}

TEST(TaskTest, GradOutputMustMatchOutput) {
  auto task = Misbehaving("{}");
  ASSERT_NE(task, nullptr);
  Tensor grad = Tensor::Zeros(DType::kFloat32, {4, 3});
  auto r =
      task->ComputeLoss(RandomFloats({4, 2}, 1), {}, &grad, 0, 0, 1, false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "plugin \"misbehaving\": compute_loss: grad_output must be a host "
            "float32 tensor shaped [4, 2]");
  // Eval needs no gradient buffer.
  auto e =
      task->ComputeLoss(RandomFloats({4, 2}, 1), {}, nullptr, 0, 0, 1, true);
  EXPECT_TRUE(e.ok()) << e.status();
}

TEST(TaskTest, StateRowsMustMatchMicrobatch) {
  auto task = Misbehaving("{}");
  ASSERT_NE(task, nullptr);
  auto r = RunLoss(task.get(), RandomFloats({4, 2}, 1),
                   {{"labels", Int64Tensor({1, 2})}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "plugin \"misbehaving\": compute_loss: state tensor \"labels\" has "
            "shape [2]; dim 0 must equal the microbatch size 4");
}

TEST(TaskTest, MicrobatchIndexMustBeInRange) {
  auto task = Misbehaving("{}");
  ASSERT_NE(task, nullptr);
  auto r = RunLoss(task.get(), RandomFloats({4, 2}, 1), {}, 0, 2, 2);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      r.status().message(),
      "plugin \"misbehaving\": compute_loss: microbatch 2 outside [0, 2)");
}

// --- Inference: InferOutputs ----------------------------------------------

// The job's output folder for InferOutputs.
std::string OutputDir() { return testing::TempDir(); }

absl::StatusOr<NamedTensors> Infer(Task* task, const Tensor& output,
                                   int64_t row_offset = 0, int32_t mb = 0,
                                   int32_t num_mb = 1) {
  return task->InferOutputs(output, {}, row_offset, OutputDir(), mb, num_mb);
}

TEST(InferOutputsTest, ReturnsThePluginsOutputsInOrderPerMicrobatch) {
  auto task = Misbehaving(R"({"mode": "ok"})");
  ASSERT_NE(task, nullptr);
  Tensor output = RandomFloats({kB, 3}, 11);
  // Two microbatches of 2 rows; the second starts at data row 102.
  for (int mb = 0; mb < 2; ++mb) {
    Tensor out = output.Rows(2 * mb, 2 * mb + 2);
    NamedTensors state = {{"targets", Int64Tensor({5, 6})}};
    auto r = task->InferOutputs(out, state, 100 + 2 * mb, OutputDir(), mb, 2);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->size(), 2u);
    EXPECT_EQ((*r)[0].first, "doubled");
    EXPECT_EQ((*r)[1].first, "data_row");
    const Tensor& doubled = (*r)[0].second;
    ASSERT_EQ(doubled.shape(), (Shape{2, 3}));
    for (int64_t i = 0; i < 6; ++i) {
      EXPECT_EQ(doubled.data<float>()[i], 2 * out.data<float>()[i]);
    }
    const Tensor& rows = (*r)[1].second;
    ASSERT_EQ(rows.dtype(), DType::kInt64);
    EXPECT_EQ(rows.data<int64_t>()[0], 100 + 2 * mb);
    EXPECT_EQ(rows.data<int64_t>()[1], 101 + 2 * mb);
  }
}

TEST(InferOutputsTest, PluginRefusalIsInvalidArgumentNamingTheDataRow) {
  auto task = Misbehaving(R"({"mode": "infer_refuse"})");
  ASSERT_NE(task, nullptr);
  auto r = Infer(task.get(), RandomFloats({kB, 2}, 1), /*row_offset=*/40);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "plugin \"misbehaving\": infer_outputs: data row 43: refused on "
            "purpose");
}

struct InferViolation {
  std::string mode;
  std::string message;  // after `plugin "misbehaving": infer_outputs: `
};

class InferViolationTest : public ::testing::TestWithParam<InferViolation> {};

TEST_P(InferViolationTest, IsAnInternalErrorNamingTheTensor) {
  const InferViolation& v = GetParam();
  auto task = Misbehaving(absl::StrCat(R"({"mode": ")", v.mode, R"("})"));
  ASSERT_NE(task, nullptr);
  auto r = Infer(task.get(), RandomFloats({kB, 2}, 5), 8, 1, 3);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_EQ(r.status().message(),
            "plugin \"misbehaving\": infer_outputs: " + v.message);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, InferViolationTest,
    ::testing::Values(
        InferViolation{"infer_nothing",
                       "microbatch 1 (data rows 8 to 11): added no outputs; it "
                       "must add at least one tensor"},
        InferViolation{"infer_bad_name",
                       "microbatch 1 (data rows 8 to 11): output "
                       "\"doubled.npy\": its name must match [A-Za-z0-9_]+ "
                       "(it names the output's files)"},
        InferViolation{"infer_bfloat16",
                       "sink misuse: add_tensor \"doubled\": unsupported "
                       "dtype 1 (expected 0 float32, 2 int32 or 3 int64)"},
        InferViolation{"infer_rank0",
                       "microbatch 1 (data rows 8 to 11): output \"doubled\" "
                       "is float32 []: dim 0 must be the microbatch's 4 rows"},
        InferViolation{"infer_wrong_rows",
                       "microbatch 1 (data rows 8 to 11): output \"doubled\" "
                       "is float32 [5, 2]: dim 0 must be the microbatch's 4 "
                       "rows"}),
    [](const ::testing::TestParamInfo<InferViolation>& info) {
      return info.param.mode;
    });

TEST(InferOutputsTest, LaterCallsMustAddTheFirstCallsOutputs) {
  const std::string first =
      "\"doubled\" float32 [b, 2], \"data_row\" int64 [b]";
  for (const auto& [mode, later] :
       std::vector<std::pair<std::string, std::string>>{
           {"infer_changes_shape",
            "\"doubled\" float32 [b, 3], \"data_row\" int64 [b]"},
           {"infer_changes_dtype",
            "\"doubled\" int32 [b, 2], \"data_row\" int64 [b]"},
           {"infer_changes_name",
            "\"tripled\" float32 [b, 2], \"data_row\" int64 [b]"}}) {
    auto task = Misbehaving(absl::StrCat(R"({"mode": ")", mode, R"("})"));
    ASSERT_NE(task, nullptr);
    auto r0 = Infer(task.get(), RandomFloats({3, 2}, 1), 0, 0, 2);
    ASSERT_TRUE(r0.ok()) << mode << ": " << r0.status();
    auto r1 = Infer(task.get(), RandomFloats({2, 2}, 2), 3, 1, 2);
    EXPECT_EQ(r1.status().code(), absl::StatusCode::kInternal) << mode;
    EXPECT_EQ(r1.status().message(),
              absl::StrCat("plugin \"misbehaving\": infer_outputs: microbatch "
                           "1 (data rows 3 to 4): added ",
                           later, "; its first call added ", first,
                           " (every call must add the same names with the "
                           "same dtypes and trailing dims)"))
        << mode;
  }
}

TEST(InferOutputsTest, BadArgumentsAreRefusedBeforeThePluginRuns) {
  auto task = Misbehaving(R"({"mode": "infer_refuse"})");
  ASSERT_NE(task, nullptr);
  const std::string prefix = "plugin \"misbehaving\": infer_outputs: ";
  Tensor out = RandomFloats({kB, 2}, 1);
  struct Case {
    absl::StatusOr<NamedTensors> result;
    absl::StatusCode code;
    std::string message;
  };
  const std::string missing = OutputDir() + "/no_such_folder";
  const std::vector<Case> cases = {
      {task->InferOutputs(Int64Tensor({1, 2}), {}, 0, OutputDir(), 0, 1),
       absl::StatusCode::kInvalidArgument,
       "output must be float32 [b, out], got int64 [2]"},
      {task->InferOutputs(out, {{"labels", Int64Tensor({1})}}, 0, OutputDir(),
                          0, 1),
       absl::StatusCode::kInvalidArgument,
       "state tensor \"labels\" has shape [1]; dim 0 must equal the "
       "microbatch size 4"},
      {Infer(task.get(), out, 0, 1, 1), absl::StatusCode::kInvalidArgument,
       "microbatch 1 outside [0, 1)"},
      {Infer(task.get(), out, -1), absl::StatusCode::kInvalidArgument,
       "row_offset must be >= 0, got -1"},
      {task->InferOutputs(out, {}, 0, "out", 0, 1),
       absl::StatusCode::kInvalidArgument,
       "output folder \"out\" is not an absolute path"},
      {task->InferOutputs(out, {}, 0, missing, 0, 1),
       absl::StatusCode::kFailedPrecondition,
       "output folder " + missing + ": No such file or directory"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.result.status().code(), c.code) << c.result.status();
    EXPECT_EQ(c.result.status().message(), prefix + c.message);
  }
}

TEST(InferOutputsTest, RefusedAfterFinalize) {
  auto task = Misbehaving(R"({"mode": "ok"})");
  ASSERT_NE(task, nullptr);
  ASSERT_TRUE(task->Finalize().ok());
  auto r = Infer(task.get(), RandomFloats({kB, 2}, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "plugin \"misbehaving\": infer_outputs: called after finalize");
}

TEST(InferOutputsTest, PluginWithoutInferOutputsCannotRunInference) {
  auto plugin = LoadPlugin(TestdataPluginDir(), "sdk_without_context");
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->struct_size(), TRAINYARD_TASK_V1_SIZE_CURRENT);
  EXPECT_FALSE(plugin->has_infer_outputs());
  auto task = Task::Create(plugin, "{}");
  ASSERT_TRUE(task.ok()) << task.status();
  auto r = Infer(task->get(), RandomFloats({kB, 2}, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "plugin \"sdk_without_context\" cannot run inference jobs: it has "
            "no infer_outputs (task ABI v1: TrainyardTaskV1.infer_outputs is "
            "NULL)");
}

// --- Table layouts ----------------------------------------------------------

// A task of a plugin whose table ends before infer_outputs refuses
// inference, naming the plugin and its struct_size.
void ExpectOlderLayoutCannotInfer(Task* task) {
  auto infer = Infer(task, RandomFloats({kB, 2}, 1));
  EXPECT_EQ(infer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(infer.status().message(),
            absl::StrCat("plugin \"", task->plugin().name(),
                         "\" cannot run inference jobs: it has no "
                         "infer_outputs (task ABI v1: its TrainyardTaskV1 has "
                         "struct_size ",
                         task->plugin().struct_size(),
                         ", a layout from before infer_outputs)"));
}

TEST(TaskPluginTest, FirstLayoutStillLoadsAndRuns) {
  // Its table ends at destroy and garbage follows: reading past struct_size
  // would crash this test.
  auto plugin = LoadPlugin(TestdataPluginDir(), "old_layout");
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->struct_size(), TRAINYARD_TASK_V1_SIZE_BASE);
  EXPECT_EQ(plugin->table().validate_config, nullptr);
  EXPECT_EQ(plugin->table().create_confined, nullptr);
  EXPECT_EQ(plugin->table().infer_outputs, nullptr);
  EXPECT_FALSE(plugin->has_infer_outputs());
  auto task = Task::Create(plugin, R"({"any": "thing"})");
  ASSERT_TRUE(task.ok()) << task.status();
  auto fwd = (*task)->BuildForwardInputs(Batch(), 0, false);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->inputs.shape(), (Shape{kB, kD}));
  ExpectOlderLayoutCannotInfer(task->get());
}

TEST(TaskPluginTest, LayoutBeforeInferOutputsStillLoadsAndRuns) {
  // Its table ends at create_confined and garbage follows.
  auto plugin = LoadPlugin(TestdataPluginDir(), "confined_layout");
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->struct_size(), TRAINYARD_TASK_V1_SIZE_CONFINED);
  EXPECT_EQ(plugin->table_name(), "confined_layout");
  EXPECT_EQ(plugin->table().validate_config, nullptr);
  EXPECT_NE(plugin->table().create_confined, nullptr);
  EXPECT_EQ(plugin->table().infer_outputs, nullptr);
  EXPECT_FALSE(plugin->has_infer_outputs());
  // A config with a path goes to its create_confined.
  auto task =
      Task::Create(plugin, R"({"any": "thing"})", MakeDir("confined_layout"));
  ASSERT_TRUE(task.ok()) << task.status();
  auto fwd = (*task)->BuildForwardInputs(Batch(), 0, true);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  ExpectOlderLayoutCannotInfer(task->get());
}

TEST(TaskPluginTest, CurrentLayoutCarriesTheNewEntries) {
  auto plugin = LoadPlugin(PluginDir(), "mse");
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->struct_size(), TRAINYARD_TASK_V1_SIZE_CURRENT);
  EXPECT_NE(plugin->table().validate_config, nullptr);
  EXPECT_NE(plugin->table().create_confined, nullptr);
  EXPECT_TRUE(plugin->has_infer_outputs());
}

TEST(TaskPluginTest, SdkPluginWithoutCreateContextGetsNoNewEntries) {
  auto plugin = LoadPlugin(TestdataPluginDir(), "sdk_without_context");
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->struct_size(), TRAINYARD_TASK_V1_SIZE_CURRENT);
  EXPECT_EQ(plugin->table().validate_config, nullptr);
  EXPECT_EQ(plugin->table().create_confined, nullptr);
  EXPECT_TRUE(Task::Create(plugin, R"({"path": "x"})").ok());
}

TEST(TaskTest, DataFolderGoesToCreateConfined) {
  // mse has no paths; its create_confined accepts any config create does.
  auto plugin = LoadPlugin(PluginDir(), "mse");
  ASSERT_NE(plugin, nullptr);
  auto task =
      Task::Create(plugin, R"({"reduction": "mean"})", MakeDir("confined_mse"));
  EXPECT_TRUE(task.ok()) << task.status();
  auto bad =
      Task::Create(plugin, R"({"reduction": "sum"})", MakeDir("confined_mse"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "plugin \"mse\": create: task.config.reduction: only \"mean\" is "
            "supported, got \"sum\"");
}

TEST(TaskTest, PluginThatCannotConfineGetsOnlyAnEmptyConfig) {
  const std::string data = MakeDir("confined_old");
  char real[PATH_MAX];
  ASSERT_NE(realpath(data.c_str(), real), nullptr);
  for (const char* name : {"old_layout", "sdk_without_context"}) {
    auto plugin = LoadPlugin(TestdataPluginDir(), name);
    ASSERT_NE(plugin, nullptr);
    for (const std::string empty : {"", "{}", " { }\n"}) {
      auto task = Task::Create(plugin, empty, data);
      EXPECT_TRUE(task.ok()) << name << " '" << empty << "': " << task.status();
    }
    auto task = Task::Create(plugin, R"({"path": "/etc/passwd"})", data);
    ASSERT_FALSE(task.ok()) << name;
    EXPECT_EQ(task.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(task.status().message(),
              absl::StrCat("plugin \"", name,
                           "\": create: the plugin cannot confine file paths "
                           "in task.config to the data folder ",
                           real,
                           " (its table has no create_confined: built before "
                           "it, or from an SDK plugin whose Create takes no "
                           "CreateContext), so it accepts only an empty "
                           "task.config here"));
    // Without a data folder nothing is confined, as before.
    EXPECT_TRUE(Task::Create(plugin, R"({"path": "/etc/passwd"})").ok());
  }
}

TEST(TaskTest, MissingDataFolderIsFailedPrecondition) {
  auto plugin = LoadPlugin(PluginDir(), "mse");
  ASSERT_NE(plugin, nullptr);
  auto task = Task::Create(plugin, "{}", "/nonexistent/data");
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(task.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(task.status().message(),
            "plugin \"mse\": create: data folder /nonexistent/data: No such "
            "file or directory");
}

}  // namespace
}  // namespace trainyard
