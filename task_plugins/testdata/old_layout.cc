// A working plugin built the way plugins were before fields were appended
// to TrainyardTaskV1. By default its table is the first v1 layout (ending at
// destroy, struct_size TRAINYARD_TASK_V1_SIZE_BASE); with OLD_LAYOUT_CONFINED
// defined it is the layout before infer_outputs (ending at create_confined,
// TRAINYARD_TASK_V1_SIZE_CONFINED). The words after the table in memory are
// non-NULL garbage, so a host that read fields past struct_size would call
// through them and crash.
//
// Config: anything. inputs = features; loss 0 with weight 0.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "task_plugins/task_abi.h"

namespace {

// The first v1 layout, written out as an old plugin's header had it.
struct TaskV1FirstLayout {
  uint32_t abi_version;
  uint32_t struct_size;
  const char* name;
  void* (*create)(const char*, TrainyardError*);
  int (*build_forward_inputs)(void*, const TrainyardBatch*, TrainyardSink*,
                              TrainyardError*);
  int (*compute_loss)(void*, const TrainyardLossArgs*, TrainyardLossResult*,
                      TrainyardSink*, TrainyardError*);
  int (*update_metrics)(void*, int32_t, TrainyardSink*, TrainyardError*);
  int (*state_dict)(void*, TrainyardSink*, TrainyardError*);
  int (*load_state_dict)(void*, const void*, size_t, TrainyardError*);
  int (*on_event)(void*, const TrainyardEvent*, TrainyardError*);
  int (*process_outputs)(void*, const TrainyardLossArgs*, TrainyardSink*,
                         TrainyardError*);
  int (*finalize)(void*, TrainyardError*);
  void (*destroy)(void*);
};
static_assert(sizeof(TaskV1FirstLayout) == TRAINYARD_TASK_V1_SIZE_BASE,
              "TRAINYARD_TASK_V1_SIZE_BASE must be the first layout's size");

// The layout before infer_outputs, as a plugin's header had it then.
struct TaskV1ConfinedLayout {
  TaskV1FirstLayout first;
  int (*validate_config)(const char*, TrainyardError*);
  void* (*create_confined)(const char*, const char*, TrainyardError*);
};
static_assert(sizeof(TaskV1ConfinedLayout) == TRAINYARD_TASK_V1_SIZE_CONFINED,
              "TRAINYARD_TASK_V1_SIZE_CONFINED must be the size of the layout "
              "ending at create_confined");

#ifdef OLD_LAYOUT_CONFINED
using OldLayout = TaskV1ConfinedLayout;
#else
using OldLayout = TaskV1FirstLayout;
#endif

struct TableAndGarbage {
  OldLayout table;
  uintptr_t garbage[4];  // where the fields appended since are now
};

void* Create(const char* config_json, TrainyardError* err) {
  if (config_json == nullptr) {
    std::strcpy(err->message, "config is NULL");
    return nullptr;
  }
  static int handle;
  return &handle;
}

int Build(void*, const TrainyardBatch* batch, TrainyardSink* out,
          TrainyardError* err) {
  for (int32_t i = 0; i < batch->num_tensors; ++i) {
    const TrainyardTensor& t = batch->tensors[i];
    if (std::strcmp(t.name, "features") != 0) continue;
    void* p = out->add_tensor(out->ctx, "inputs", t.dtype, t.ndim, t.shape);
    if (p == nullptr) {
      std::strcpy(err->message, "host refused inputs");
      return 1;
    }
    std::memcpy(p, t.data, sizeof(float) * t.shape[0] * t.shape[1]);
    return 0;
  }
  std::strcpy(err->message, "no features");
  return 1;
}

int Loss(void*, const TrainyardLossArgs*, TrainyardLossResult* result,
         TrainyardSink*, TrainyardError*) {
  result->loss = 0;
  result->loss_weight = 0;
  return 0;
}

int Metrics(void*, int32_t, TrainyardSink*, TrainyardError*) { return 0; }

void Destroy(void*) {}

#ifdef OLD_LAYOUT_CONFINED
constexpr char kName[] = "confined_layout";
#else
constexpr char kName[] = "old_layout";
#endif

constexpr TaskV1FirstLayout kFirst = {TRAINYARD_TASK_ABI_VERSION,
                                      sizeof(OldLayout),
                                      kName,
                                      &Create,
                                      &Build,
                                      &Loss,
                                      &Metrics,
                                      nullptr,
                                      nullptr,
                                      nullptr,
                                      nullptr,
                                      nullptr,
                                      &Destroy};

#ifdef OLD_LAYOUT_CONFINED
void* CreateConfined(const char* config_json, const char*,
                     TrainyardError* err) {
  return Create(config_json, err);
}
const TableAndGarbage kTable = {{kFirst, nullptr, &CreateConfined},
                                {0x1, 0x1, 0x1, 0x1}};
#else
const TableAndGarbage kTable = {kFirst, {0x1, 0x1, 0x1, 0x1}};
#endif

}  // namespace

extern "C" __attribute__((visibility("default"))) const TrainyardTaskV1*
trainyard_task_v1(void) {
  return reinterpret_cast<const TrainyardTaskV1*>(&kTable.table);
}
