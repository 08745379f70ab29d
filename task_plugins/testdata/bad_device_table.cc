// A working v1 plugin whose v2 (device) table breaks one load-time rule,
// chosen by a define: BAD_DEVICE_TABLE_SLOTS (num_slots 3),
// BAD_DEVICE_TABLE_V1 (v1 points at another table), BAD_DEVICE_TABLE_NULL
// (finish_loss NULL) or BAD_DEVICE_TABLE_FLAGS (an unknown flag bit). The
// loader must refuse the plugin before any call.
#include <cstring>

#include "task_plugins/task_abi.h"

namespace {

void* Create(const char*, TrainyardError*) {
  static int handle;
  return &handle;
}
int Build(void*, const TrainyardBatch*, TrainyardSink*, TrainyardError*) {
  return 0;
}
int Loss(void*, const TrainyardLossArgs*, TrainyardLossResult*, TrainyardSink*,
         TrainyardError*) {
  return 0;
}
int Metrics(void*, int32_t, TrainyardSink*, TrainyardError*) { return 0; }
void Destroy(void*) {}
size_t Workspace(void*, int64_t, int64_t) { return 0; }
int LossDevice(void*, const TrainyardDeviceLossArgs*, TrainyardError*) {
  return 0;
}
int Finish(void*, const double*, int64_t, int32_t, int32_t, int32_t,
           TrainyardSink*, TrainyardError*) {
  return 0;
}

TrainyardTaskV1 MakeV1() {
  TrainyardTaskV1 t;
  std::memset(&t, 0, sizeof(t));
  t.abi_version = TRAINYARD_TASK_ABI_VERSION;
  t.struct_size = sizeof(TrainyardTaskV1);
  t.name = "bad_device_table";
  t.create = &Create;
  t.build_forward_inputs = &Build;
  t.compute_loss = &Loss;
  t.update_metrics = &Metrics;
  t.destroy = &Destroy;
  return t;
}

const TrainyardTaskV1 kV1 = MakeV1();
const TrainyardTaskV1 kOtherV1 = MakeV1();

TrainyardTaskV2 MakeV2() {
  TrainyardTaskV2 t;
  std::memset(&t, 0, sizeof(t));
  t.abi_version = TRAINYARD_TASK_ABI_VERSION_2;
  t.struct_size = sizeof(TrainyardTaskV2);
  t.v1 = &kV1;
  t.num_slots = 4;
  t.workspace_bytes = &Workspace;
  t.compute_loss_device = &LossDevice;
  t.finish_loss = &Finish;
#if defined(BAD_DEVICE_TABLE_SLOTS)
  t.num_slots = 3;
#elif defined(BAD_DEVICE_TABLE_V1)
  t.v1 = &kOtherV1;
#elif defined(BAD_DEVICE_TABLE_NULL)
  t.finish_loss = nullptr;
#elif defined(BAD_DEVICE_TABLE_FLAGS)
  t.flags = 0x6;
#else
#error "define one BAD_DEVICE_TABLE_* defect"
#endif
  return t;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const TrainyardTaskV1*
trainyard_task_v1(void) {
  return &kV1;
}

extern "C" __attribute__((visibility("default"))) const TrainyardTaskV2*
trainyard_task_v2(void) {
  static const TrainyardTaskV2 table = MakeV2();
  return &table;
}
