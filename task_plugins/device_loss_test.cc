// Task ABI v2 through the loader, on the simulated device (sim:0): what the
// host checks of a device table and of compute_loss_device's arguments, and
// the shipped plugins' device losses against their own host losses (ABI
// v1): the same loss and metrics bits, the gradient the engine makes of the
// host one (times float32(w), in the output's dtype).
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/bfloat16.h"
#include "core/sim_device.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "task_plugins/plugin_test_util.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using testing::Int32Tensor;
using testing::LoadPlugin;
using testing::PluginDir;
using testing::RandomFloats;
using testing::TestdataPluginDir;

const Device kSim = Device::Sim(0);

// A copy of host tensor `t` on sim:0, in `dtype` (float32 -> bfloat16
// rounds).
Tensor ToSim(const Tensor& t, DType dtype) {
  Tensor d = *Tensor::Create(dtype, t.shape(), SimAllocator(0));
  Tensor view = SimDeviceAccess::HostView(d);
  if (dtype == t.dtype()) {
    if (t.nbytes() > 0) std::memcpy(view.raw_data(), t.raw_data(), t.nbytes());
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) {
      view.data<uint16_t>()[i] = FloatToBf16(t.data<float>()[i]);
    }
  }
  return d;
}

// A float32 host tensor of `t` (sim:0, float32 or bfloat16).
Tensor FromSim(const Tensor& t) {
  Tensor view = SimDeviceAccess::HostView(t);
  if (t.dtype() == DType::kFloat32) return view.Clone();
  Tensor out = Tensor::Empty(DType::kFloat32, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) {
    out.data<float>()[i] = Bf16ToFloat(view.data<uint16_t>()[i]);
  }
  return out;
}

TEST(DeviceTableTest, ShippedPluginsHaveADeviceLoss) {
  for (const char* name : {"mse", "cross_entropy", "logit_distillation"}) {
    auto p = TaskPlugin::Load(PluginDir(), name);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE((*p)->has_device_loss()) << name;
    // The teacher runs on the host: distillation cannot pass inputs through.
    EXPECT_EQ((*p)->passes_inputs_through(),
              std::string(name) != "logit_distillation")
        << name;
  }
}

TEST(DeviceTableTest, ABadDeviceTableIsRefusedNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"slots", "TrainyardTaskV2.num_slots is 3, expected 4 to 64"},
      {"v1", "TrainyardTaskV2.v1 is not the table trainyard_task_v1() returns"},
      {"null", "required function TrainyardTaskV2.finish_loss is NULL"},
      {"flags", "TrainyardTaskV2.flags has unknown bits 0x6"},
  };
  for (const auto& [defect, message] : cases) {
    const std::string name = absl::StrCat("bad_device_", defect);
    auto p = TaskPlugin::Load(TestdataPluginDir(), name);
    ASSERT_FALSE(p.ok()) << name;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(p.status().message(),
              absl::StrCat("plugin \"", name, "\": ", TestdataPluginDir(),
                           "/lib", name, ".so: ", message));
  }
}

std::unique_ptr<Task> MakeTask(const std::string& plugin,
                               const std::string& config = "{}") {
  auto p = LoadPlugin(PluginDir(), plugin);
  if (p == nullptr) return nullptr;
  auto task = Task::Create(p, config);
  EXPECT_TRUE(task.ok()) << task.status();
  return task.ok() ? std::move(*task) : nullptr;
}

// Runs the device loss of one microbatch on sim:0 and reads its slots.
struct DeviceRun {
  absl::Status status;
  std::vector<double> slots;
  Tensor grad;  // float32 host copy
};
DeviceRun RunDevice(Task* task, const Tensor& out_host, DType dtype,
                    const NamedTensors& state_host, int32_t mb = 0,
                    int32_t num_mb = 1, bool is_eval = false) {
  DeviceRun r;
  Tensor out = ToSim(out_host, dtype);
  NamedTensors state;
  for (const auto& [name, t] : state_host) {
    state.push_back({name, ToSim(t, t.dtype())});
  }
  Tensor grad = *Tensor::Create(dtype, out.shape(), SimAllocator(0));
  const int slots_n = task->plugin().device_table().num_slots;
  Tensor slots =
      ToSim(Tensor::Zeros(DType::kFloat64, {slots_n}), DType::kFloat64);
  const size_t ws_bytes =
      task->DeviceLossWorkspaceBytes(out.dim(0), out.dim(1));
  Tensor ws = *Tensor::Create(DType::kUInt8, {static_cast<int64_t>(ws_bytes)},
                              SimAllocator(0));
  r.status = task->ComputeLossDevice(kSim, nullptr, out, state, &grad,
                                     static_cast<double*>(slots.ptr()), ws, 7,
                                     mb, num_mb, is_eval);
  const double* s = SimDeviceAccess::HostView(slots).data<double>();
  r.slots.assign(s, s + slots_n);
  if (!is_eval) r.grad = FromSim(grad);
  return r;
}

// v1 through the loader: the loss, weight and host gradient.
struct HostRun {
  LossResult result;
  Tensor grad;
};
HostRun RunHost(Task* task, const Tensor& out, const NamedTensors& state) {
  HostRun h;
  h.grad = Tensor::Zeros(DType::kFloat32, out.shape());
  auto r = task->ComputeLoss(out, state, &h.grad, 7, 0, 1, false);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) h.result = *r;
  return h;
}

// The device loss of each shipped plugin equals its host loss: same loss
// bits; gradient = the engine's float32(w) scaling of the host gradient,
// rounded to the output dtype.
void ExpectDeviceMatchesHost(const std::string& plugin,
                             const std::string& config, const Tensor& out,
                             const NamedTensors& host_state,
                             const NamedTensors& device_state) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(::testing::Message() << plugin << " " << DTypeName(dtype));
    // The host sees what the device sees: bf16 outputs widened.
    Tensor seen = FromSim(ToSim(out, dtype));
    std::unique_ptr<Task> host_task = MakeTask(plugin, config);
    std::unique_ptr<Task> dev_task = MakeTask(plugin, config);
    ASSERT_TRUE(host_task && dev_task);
    HostRun h = RunHost(host_task.get(), seen, host_state);
    DeviceRun d = RunDevice(dev_task.get(), out, dtype, device_state);
    ASSERT_TRUE(d.status.ok()) << d.status;
    auto fin = dev_task->FinishLoss(d.slots.data(), 7, 0, 1, false);
    ASSERT_TRUE(fin.ok()) << fin.status();
    EXPECT_EQ(fin->loss, h.result.loss);
    EXPECT_EQ(fin->weight, h.result.weight);
    EXPECT_EQ(fin->weighted_loss, h.result.weighted_loss);
    const float w = static_cast<float>(h.result.weight);
    for (int64_t i = 0; i < out.numel(); ++i) {
      float want = h.grad.data<float>()[i] * w;
      if (dtype == DType::kBFloat16) want = Bf16ToFloat(FloatToBf16(want));
      ASSERT_EQ(d.grad.data<float>()[i], want) << i;
    }
    auto hm = host_task->UpdateMetrics(false);
    auto dm = dev_task->UpdateMetrics(false);
    ASSERT_TRUE(hm.ok() && dm.ok());
    EXPECT_EQ(*hm, *dm);
  }
}

TEST(DeviceLossTest, MseOnTheDeviceIsItsHostLoss) {
  const Tensor out = RandomFloats({5, 3}, 1);
  const Tensor y = RandomFloats({5, 3}, 2);
  ExpectDeviceMatchesHost("mse", "{}", out, {{"targets", y}}, {{"targets", y}});
}

TEST(DeviceLossTest, CrossEntropyOnTheDeviceIsItsHostLoss) {
  const Tensor out = RandomFloats({6, 4}, 3);
  const Tensor y = Int32Tensor({0, 3, -100, 1, 2, 3});
  // Host stages get int64 "labels" from build_forward_inputs; device
  // stages the batch's own "targets".
  ExpectDeviceMatchesHost(
      "cross_entropy", R"({"label_smoothing": 0.1})", out,
      {{"labels", testing::Int64Tensor({0, 3, -100, 1, 2, 3})}},
      {{"targets", y}});
}

TEST(DeviceLossTest, ABadLabelFailsInFinishLossWithTheHostMessage) {
  std::unique_ptr<Task> task = MakeTask("cross_entropy");
  ASSERT_TRUE(task);
  const Tensor out = RandomFloats({3, 4}, 4);
  DeviceRun d = RunDevice(task.get(), out, DType::kFloat32,
                          {{"targets", Int32Tensor({1, 9, 2})}}, 2, 4);
  ASSERT_TRUE(d.status.ok()) << d.status;  // nothing read on the host yet
  auto fin = task->FinishLoss(d.slots.data(), 7, 2, 4, false);
  ASSERT_FALSE(fin.ok());
  EXPECT_EQ(fin.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fin.status().message(),
            "plugin \"cross_entropy\": finish_loss: microbatch 2 of 4, row 1: "
            "label 9 outside [0, 4) and not ignore_index -100");
}

TEST(DeviceLossTest, HostTensorsAndTheCpuAreRefused) {
  std::unique_ptr<Task> task = MakeTask("mse");
  ASSERT_TRUE(task);
  const Tensor out = RandomFloats({2, 2}, 5);
  Tensor grad = Tensor::Zeros(DType::kFloat32, {2, 2});
  double slots[8] = {};
  absl::Status st =
      task->ComputeLossDevice(kSim, nullptr, out, {{"targets", out}}, &grad,
                              slots, Tensor(), 0, 0, 1, false);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("output must be float32 or bfloat16 "
                                      "[b, out] on sim:0, got float32 [2, 2] "
                                      "on cpu"));
  st = task->ComputeLossDevice(Device::Cpu(), nullptr, out, {}, &grad, slots,
                               Tensor(), 0, 0, 1, false);
  EXPECT_THAT(st.message(), HasSubstr("needs a device (CUDA or simulated)"));
  Tensor dev = ToSim(out, DType::kFloat32);
  Tensor dev_grad = ToSim(out, DType::kFloat32);
  st = task->ComputeLossDevice(kSim, nullptr, dev, {{"targets", out}},
                               &dev_grad, slots, Tensor(), 0, 0, 1, false);
  EXPECT_THAT(st.message(), HasSubstr("bytes of workspace on sim:0, got 0"));
  Tensor ws = *Tensor::Create(
      DType::kUInt8,
      {static_cast<int64_t>(task->DeviceLossWorkspaceBytes(2, 2))},
      SimAllocator(0));
  st = task->ComputeLossDevice(kSim, nullptr, dev, {{"targets", out}},
                               &dev_grad, slots, ws, 0, 0, 1, false);
  EXPECT_THAT(st.message(),
              HasSubstr("state tensor \"targets\" is [2, 2] on cpu"));
}

TEST(DeviceLossTest, SlotsThatBreakTheContractAreInternalErrors) {
  std::unique_ptr<Task> task = MakeTask("mse");
  ASSERT_TRUE(task);
  double slots[6] = {-1, 0, 0, 0, 0, 0};
  auto r = task->FinishLoss(slots, 3, 1, 2, false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(r.status().message(),
            "plugin \"mse\": compute_loss_device: step 3 microbatch 1: "
            "loss_weight must be finite and >= 0, got -1");
  double nan_loss[6] = {2, std::nan(""), 0, 0, 0, 0};
  r = task->FinishLoss(nan_loss, 3, 1, 2, false);
  EXPECT_THAT(r.status().message(), HasSubstr("loss is not finite: nan"));
  double zero_weight[6] = {0, 1.5, 0, 0, 0, 0};
  r = task->FinishLoss(zero_weight, 3, 1, 2, false);
  EXPECT_THAT(r.status().message(),
              HasSubstr("loss_weight is 0 but loss is 1.5"));
}

}  // namespace
}  // namespace trainyard
