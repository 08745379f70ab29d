// A plugin whose table breaks one load-time rule, chosen by a define:
// BAD_TABLE_BAD_VERSION, BAD_TABLE_BAD_STRUCT_SIZE or
// BAD_TABLE_NULL_FUNCTION. The loader must refuse it before any call.
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

TrainyardTaskV1 MakeTable() {
  TrainyardTaskV1 t;
  std::memset(&t, 0, sizeof(t));
  t.abi_version = TRAINYARD_TASK_ABI_VERSION;
  t.struct_size = sizeof(TrainyardTaskV1);
  t.name = "bad_table";
  t.create = &Create;
  t.build_forward_inputs = &Build;
  t.compute_loss = &Loss;
  t.update_metrics = &Metrics;
  t.destroy = &Destroy;
#if defined(BAD_TABLE_BAD_VERSION)
  t.abi_version = 2;
#elif defined(BAD_TABLE_BAD_STRUCT_SIZE)
  t.struct_size = TRAINYARD_TASK_V1_SIZE_CONFINED - sizeof(void*);
#elif defined(BAD_TABLE_NULL_FUNCTION)
  t.compute_loss = nullptr;
#else
#error "define one BAD_TABLE_* defect"
#endif
  return t;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const TrainyardTaskV1*
trainyard_task_v1(void) {
  static const TrainyardTaskV1 table = MakeTable();
  return &table;
}
