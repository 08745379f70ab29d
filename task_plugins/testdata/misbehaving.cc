// Test plugin "misbehaving": a small working task, plus one contract
// violation chosen by config {"mode": "<mode>", "fail_at_step": N}.
//
// Working behaviour (mode "ok"): inputs = features; state "targets" = a copy
// of the batch's targets; loss = sum(output^2) / (2 b), grad = output / b,
// weight = b; per-microbatch metric "rows"; update_metrics reports
// "loss_calls" (compute_loss calls since the last update) and "events"
// (on_event calls so far) and "last_event_step"; state_dict is the 8-byte
// total count of compute_loss calls; finalize fails if called twice;
// infer_outputs adds "doubled" float32 [b, out] (2 * output) and "data_row"
// int64 [b] (row_offset + i).
//
// Written against the raw ABI (not the SDK) so it can break every rule,
// including throwing across the boundary.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "task_plugins/plugin_sdk.h"
#include "task_plugins/task_abi.h"

namespace {

using trainyard::plugin::FindTensor;
using trainyard::plugin::NumElements;
using trainyard::plugin::SetError;

struct Task {
  std::string mode;
  int64_t fail_at_step = -1;
  int64_t loss_calls = 0;   // since update_metrics
  int64_t total_calls = 0;  // state
  int64_t events = 0;
  int64_t last_event_step = -1;
  int64_t infer_calls = 0;
  bool finalized = false;
};

bool Is(const Task* t, const char* mode) { return t->mode == mode; }

void* Create(const char* config_json, TrainyardError* err) {
  auto config =
      trainyard::plugin::ParseConfig(config_json, {"mode", "fail_at_step"});
  if (!config.ok()) {
    SetError(err, std::string(config.status().message()));
    return nullptr;
  }
  auto mode = trainyard::plugin::GetString(*config, "mode", "ok");
  auto fail_at = trainyard::plugin::GetInt(*config, "fail_at_step", -1);
  if (!mode.ok() || !fail_at.ok()) {
    SetError(err, "bad mode or fail_at_step");
    return nullptr;
  }
  if (*mode == "refuse") {
    SetError(err, "config refused on purpose (mode \"refuse\")");
    return nullptr;
  }
  if (*mode == "null_without_message") return nullptr;
  if (*mode == "leave_thread") {
    // A thread that keeps running plugin code after the task and the
    // library handle are gone (like a BLAS pool's workers).
    std::thread([] {
      for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }).detach();
  }
  Task* t = new Task();
  t->mode = *mode;
  t->fail_at_step = *fail_at;
  return t;
}

int Build(void* handle, const TrainyardBatch* batch, TrainyardSink* out,
          TrainyardError* err) {
  Task* t = static_cast<Task*>(handle);
  auto f = FindTensor(batch->tensors, batch->num_tensors, "features");
  if (!f.ok()) {
    SetError(err, std::string(f.status().message()));
    return 1;
  }
  const TrainyardTensor& features = **f;
  const int64_t b = features.shape[0];
  const int64_t d = features.shape[1];
  if (Is(t, "bytes_in_build")) out->add_bytes(out->ctx, "x", 1);
  if (!Is(t, "missing_inputs")) {
    int64_t shape[3] = {b, d, 1};
    int32_t dtype = TRAINYARD_FLOAT32;
    int32_t ndim = 2;
    if (Is(t, "wrong_inputs_rows")) shape[0] = b + 1;
    if (Is(t, "inputs_int32")) dtype = TRAINYARD_INT32;
    if (Is(t, "inputs_rank3")) ndim = 3;
    void* p = out->add_tensor(out->ctx, "inputs", dtype, ndim, shape);
    if (p == nullptr) {
      SetError(err, "host refused inputs");
      return 1;
    }
    if (dtype == TRAINYARD_FLOAT32 && shape[0] == b) {
      std::memcpy(p, features.data, sizeof(float) * b * d);
    }
  }
  if (Is(t, "duplicate_tensor")) {
    // Ignores the host's refusal (NULL) and reports success.
    int64_t shape[2] = {b, d};
    out->add_tensor(out->ctx, "inputs", TRAINYARD_FLOAT32, 2, shape);
  }
  if (Is(t, "huge_tensor")) {
    int64_t shape[2] = {int64_t{1} << 40, int64_t{1} << 20};
    if (out->add_tensor(out->ctx, "huge", TRAINYARD_FLOAT32, 2, shape) ==
        nullptr) {
      SetError(err, "host refused the huge tensor");
      return 1;
    }
  }
  if (Is(t, "state_bad_rows")) {
    int64_t shape[1] = {b + 2};
    out->add_tensor(out->ctx, "weights", TRAINYARD_FLOAT32, 1, shape);
  }
  auto targets = FindTensor(batch->tensors, batch->num_tensors, "targets");
  if (targets.ok()) {
    const TrainyardTensor& tt = **targets;
    void* p = out->add_tensor(out->ctx, "targets", tt.dtype, tt.ndim, tt.shape);
    if (p == nullptr) {
      SetError(err, "host refused targets");
      return 1;
    }
    const size_t elem = tt.dtype == TRAINYARD_INT64 ? 8 : 4;
    std::memcpy(p, tt.data, elem * NumElements(tt));
  }
  return 0;
}

int Loss(void* handle, const TrainyardLossArgs* args,
         TrainyardLossResult* result, TrainyardSink* metrics,
         TrainyardError* err) {
  Task* t = static_cast<Task*>(handle);
  ++t->loss_calls;
  ++t->total_calls;
  if (args->step == t->fail_at_step && Is(t, "loss_error_at_step")) {
    SetError(err, "injected failure at step " + std::to_string(args->step) +
                      " microbatch " + std::to_string(args->microbatch));
    return 1;
  }
  if (Is(t, "throw")) throw std::runtime_error("thrown on purpose");
  if (Is(t, "unterminated_error")) {
    std::memset(err->message, 'x', sizeof(err->message));
    return 1;
  }
  if (Is(t, "error_without_message")) return 1;
  const TrainyardTensor& out = *args->output;
  const int64_t b = out.shape[0];
  const int64_t n = NumElements(out);
  const float* o = static_cast<const float*>(out.data);
  float* g = static_cast<float*>(args->grad_output->data);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += 0.5 * o[i] * o[i];
    if (g != nullptr) g[i] = static_cast<float>(o[i] / b);
  }
  result->loss = b > 0 ? sum / b : 0;
  result->loss_weight = static_cast<double>(b);
  if (Is(t, "nan_loss")) result->loss = std::nan("");
  if (Is(t, "inf_weight")) result->loss_weight = INFINITY;
  if (Is(t, "negative_weight")) result->loss_weight = -1;
  if (Is(t, "zero_weight_nonzero_loss")) result->loss_weight = 0;
  if (Is(t, "nan_grad") && g != nullptr && n > 1) g[n - 1] = NAN;
  // Finite, but overflows to inf once the engine scales it by the weight.
  if (Is(t, "huge_grad") && g != nullptr) {
    for (int64_t i = 0; i < n; ++i) g[i] = 3e38f;
  }
  if (Is(t, "tensor_in_loss")) {
    int64_t shape[1] = {1};
    metrics->add_tensor(metrics->ctx, "x", TRAINYARD_FLOAT32, 1, shape);
  }
  metrics->add_metric(metrics->ctx, "rows", static_cast<double>(b));
  return 0;
}

int Metrics(void* handle, int32_t is_eval, TrainyardSink* out,
            TrainyardError* err) {
  Task* t = static_cast<Task*>(handle);
  if (Is(t, "metric_nan")) out->add_metric(out->ctx, "bad", NAN);
  if (Is(t, "duplicate_metric")) out->add_metric(out->ctx, "events", 1);
  out->add_metric(out->ctx, "loss_calls", static_cast<double>(t->loss_calls));
  out->add_metric(out->ctx, "events", static_cast<double>(t->events));
  out->add_metric(out->ctx, "last_event_step",
                  static_cast<double>(t->last_event_step));
  t->loss_calls = 0;
  return 0;
}

int StateDict(void* handle, TrainyardSink* out, TrainyardError* err) {
  Task* t = static_cast<Task*>(handle);
  out->add_bytes(out->ctx, &t->total_calls, sizeof(t->total_calls));
  return 0;
}

int LoadStateDict(void* handle, const void* data, size_t len,
                  TrainyardError* err) {
  Task* t = static_cast<Task*>(handle);
  if (len != sizeof(t->total_calls)) {
    SetError(err, "state must be 8 bytes, got " + std::to_string(len));
    return 1;
  }
  std::memcpy(&t->total_calls, data, len);
  return 0;
}

int OnEvent(void* handle, const TrainyardEvent* event, TrainyardError* err) {
  Task* t = static_cast<Task*>(handle);
  ++t->events;
  t->last_event_step = event->step;
  return 0;
}

int Finalize(void* handle, TrainyardError* err) {
  Task* t = static_cast<Task*>(handle);
  if (t->finalized) {
    SetError(err, "finalize called twice");
    return 1;
  }
  t->finalized = true;
  return 0;
}

void Destroy(void* handle) { delete static_cast<Task*>(handle); }

// "doubled" float32 [b, out] = 2 * output, with the violations of the
// "infer_*" modes; the modes "infer_changes_*" break the rule that every call
// adds the same outputs from the second call on.
void AddDoubled(const Task* t, const TrainyardTensor& out, bool later,
                TrainyardSink* sink) {
  int64_t shape[2] = {out.shape[0], out.shape[1]};
  int32_t dtype = TRAINYARD_FLOAT32;
  int32_t ndim = 2;
  const char* name = "doubled";
  if (Is(t, "infer_bad_name")) name = "doubled.npy";
  if (Is(t, "infer_bfloat16")) dtype = TRAINYARD_BFLOAT16;
  if (Is(t, "infer_rank0")) ndim = 0;
  if (Is(t, "infer_wrong_rows")) shape[0] += 1;
  if (later && Is(t, "infer_changes_shape")) shape[1] += 1;
  if (later && Is(t, "infer_changes_dtype")) dtype = TRAINYARD_INT32;
  if (later && Is(t, "infer_changes_name")) name = "tripled";
  void* p = sink->add_tensor(sink->ctx, name, dtype, ndim, shape);
  if (p == nullptr) return;  // ignores the refusal: the host reports it
  if (dtype == TRAINYARD_FLOAT32 && ndim == 2 && shape[0] == out.shape[0] &&
      shape[1] == out.shape[1]) {
    const float* o = static_cast<const float*>(out.data);
    float* d = static_cast<float*>(p);
    for (int64_t i = 0; i < NumElements(out); ++i) d[i] = 2 * o[i];
  }
}

int Infer(void* handle, const TrainyardInferArgs* args, TrainyardSink* out,
          TrainyardError* err) {
  Task* t = static_cast<Task*>(handle);
  const bool later = t->infer_calls++ > 0;
  const int64_t b = args->output->shape[0];
  if (Is(t, "infer_refuse")) {
    SetError(err, "data row " + std::to_string(args->row_offset + b - 1) +
                      ": refused on purpose");
    return 1;
  }
  if (Is(t, "infer_nothing")) return 0;
  AddDoubled(t, *args->output, later, out);
  int64_t* rows = static_cast<int64_t*>(
      out->add_tensor(out->ctx, "data_row", TRAINYARD_INT64, 1, &b));
  if (rows == nullptr) {
    SetError(err, "host refused data_row");
    return 1;
  }
  for (int64_t i = 0; i < b; ++i) rows[i] = args->row_offset + i;
  return 0;
}

// Its config holds no file paths, so there is nothing to confine.
void* CreateConfined(const char* config_json, const char*,
                     TrainyardError* err) {
  return Create(config_json, err);
}

// Accepts what create accepts, except for modes that break validate_config:
// "validate_refuse" (a message naming no field), "validate_silent" (no
// message), "validate_long" (a message of 2-byte UTF-8 characters filling
// the whole buffer) and "validate_throw" (an exception across the ABI).
int Validate(const char* config_json, TrainyardError* err) {
  auto config =
      trainyard::plugin::ParseConfig(config_json, {"mode", "fail_at_step"});
  if (!config.ok()) {
    SetError(err, std::string(config.status().message()));
    return 1;
  }
  auto mode = trainyard::plugin::GetString(*config, "mode", "ok");
  if (!mode.ok()) {
    SetError(err, std::string(mode.status().message()));
    return 1;
  }
  if (*mode == "validate_refuse") {
    SetError(err, "refused on purpose (mode \"validate_refuse\")");
    return 1;
  }
  if (*mode == "validate_silent") return 1;
  if (*mode == "validate_long") {
    std::string m;
    while (m.size() + 2 < sizeof(err->message)) m += "\xc3\xa9";  // U+00E9
    SetError(err, m);
    return 1;
  }
  if (*mode == "validate_throw") {
    throw std::runtime_error("validate_config thrown on purpose");
  }
  return 0;
}

TrainyardTaskV1 MakeTable() {
  TrainyardTaskV1 t;
  std::memset(&t, 0, sizeof(t));
  t.abi_version = TRAINYARD_TASK_ABI_VERSION;
  t.struct_size = sizeof(TrainyardTaskV1);
  t.name = "misbehaving";
  t.create = &Create;
  t.build_forward_inputs = &Build;
  t.compute_loss = &Loss;
  t.update_metrics = &Metrics;
  t.state_dict = &StateDict;
  t.load_state_dict = &LoadStateDict;
  t.on_event = &OnEvent;
  t.finalize = &Finalize;
  t.destroy = &Destroy;
  t.validate_config = &Validate;
  t.create_confined = &CreateConfined;
  t.infer_outputs = &Infer;
  return t;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const TrainyardTaskV1*
trainyard_task_v1(void) {
  static const TrainyardTaskV1 table = MakeTable();
  return &table;
}
