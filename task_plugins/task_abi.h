/* Trainyard task plugin ABI, versions 1 and 2.
 *
 * A task plugin owns the loss of a training job: it turns a raw batch into
 * model inputs (first pipeline stage), computes the loss and dLoss/dOutput for
 * each microbatch (last stage), and aggregates metrics once per step. The
 * lifecycle follows d9d's TrainTask and Megatron Bridge's loss contract:
 *
 *   create(config) -> { build_forward_inputs -> compute_loss x M
 *                       -> update_metrics }* -> finalize -> destroy
 *
 * with state_dict / load_state_dict at any point between steps. A host with
 * a data folder creates through create_confined instead of create, and
 * validate_config checks a config on its own, without a task. An inference
 * job (a job spec with "kind": "infer") runs the model forward only:
 *
 *   create(config) -> { build_forward_inputs(is_eval = 1)
 *                       -> infer_outputs x M }* -> finalize -> destroy
 *
 * and the host writes what infer_outputs adds as .npy shards.
 *
 * A plugin is a shared library lib<name>.so that exports one C symbol per
 * ABI version it speaks, `trainyard_task_v1`, returning a pointer to a static
 * TrainyardTaskV1 table. Only C types cross this boundary.
 *
 * Ownership: memory passed into a call is the host's and valid for that call
 * only. Output tensors are allocated through the sink the host passes in, and
 * belong to the host. The plugin's task handle (void*) belongs to the plugin
 * until destroy().
 *
 * Errors: a function returns 0 on success. On failure it returns non-zero
 * and writes a NUL-terminated reason into err->message (at most
 * TRAINYARD_ERROR_LEN bytes including the NUL); the host prefixes it with the
 * plugin's name and the call. A plugin must not call exit(), abort() or throw
 * across this boundary.
 *
 * Threading: the host calls one task handle from one thread at a time. The
 * first and last pipeline stage each create their own handle.
 *
 * Version 2 (TrainyardTaskV2, below) adds a device half to a v1 task: the loss
 * computed where the model's output is (a GPU, or the simulated device),
 * enqueued on the stage's stream, never waiting for it. A plugin exports it
 * beside trainyard_task_v1; v1 stays for CPU jobs and hosts before v2.
 *
 * The format is documented in docs/PLUGIN_ABI.md.
 */
#ifndef TRAINYARD_TASK_PLUGINS_TASK_ABI_H_
#define TRAINYARD_TASK_PLUGINS_TASK_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TRAINYARD_TASK_ABI_VERSION 1
#define TRAINYARD_TASK_SYMBOL_V1 "trainyard_task_v1"
#define TRAINYARD_ERROR_LEN 1024
#define TRAINYARD_MAX_DIMS 8

typedef enum TrainyardDType {
  TRAINYARD_FLOAT32 = 0,
  TRAINYARD_BFLOAT16 = 1, /* v2 device tensors only (activations in bf16) */
  TRAINYARD_INT32 = 2,
  TRAINYARD_INT64 = 3,
} TrainyardDType;

/* A dense, row-major host tensor. Tensors the host passes in (batch,
 * output, state) are read-only for the plugin although `data` is not const;
 * only grad_output and sink-allocated tensors may be written. */
typedef struct TrainyardTensor {
  const char* name; /* never NULL; "" for unnamed */
  int32_t dtype;    /* a TrainyardDType */
  int32_t ndim;     /* 0 .. TRAINYARD_MAX_DIMS */
  int64_t shape[TRAINYARD_MAX_DIMS];
  void* data; /* ndim product elements of dtype */
} TrainyardTensor;

typedef struct TrainyardError {
  char message[TRAINYARD_ERROR_LEN];
} TrainyardError;

/* Host-side receiver for what a call produces. Every callback may be used
 * only during the call it was passed to. */
typedef struct TrainyardSink {
  void* ctx;
  /* Allocates a host tensor named `name` (copied) and returns its data
   * pointer for the plugin to fill; NULL if the host refuses (bad dtype,
   * ndim, negative dims, duplicate name or out of memory). The memory is
   * zero-filled; for a zero-element tensor the pointer is non-NULL but must
   * not be dereferenced. */
  void* (*add_tensor)(void* ctx, const char* name, int32_t dtype, int32_t ndim,
                      const int64_t* shape);
  /* Records a named scalar metric. */
  void (*add_metric)(void* ctx, const char* name, double value);
  /* Appends bytes (state_dict). */
  void (*add_bytes)(void* ctx, const void* data, size_t len);
} TrainyardSink;

/* Input of build_forward_inputs: the raw batch as read from the data
 * source, named "features" (float32 [B, D]) and "targets" (int32/int64 [B]
 * or float32 [B, K]). */
typedef struct TrainyardBatch {
  const TrainyardTensor* tensors;
  int32_t num_tensors;
  int64_t step; /* 0-based optimizer step this batch is for */
  int32_t is_eval;
} TrainyardBatch;

/* Input of compute_loss, for one microbatch on the last stage. */
typedef struct TrainyardLossArgs {
  const TrainyardTensor* output; /* model output, float32 [b, out] */
  /* The per-microbatch state tensors build_forward_inputs produced (split
   * along dim 0 like the inputs), in the order they were added. */
  const TrainyardTensor* state;
  int32_t num_state;
  /* float32, same shape as *output: the plugin writes dLoss/dOutput of the
   * returned `loss` here. Ignored (may be NULL data) when is_eval. */
  TrainyardTensor* grad_output;
  int64_t step;
  int32_t microbatch;
  int32_t num_microbatches;
  int32_t is_eval;
} TrainyardLossArgs;

/* Input of infer_outputs: one microbatch of an inference job, on the last
 * stage. */
typedef struct TrainyardInferArgs {
  const TrainyardTensor* output; /* model output, float32 [b, out] */
  /* The microbatch's state tensors, as in TrainyardLossArgs. */
  const TrainyardTensor* state;
  int32_t num_state;
  /* The data row of the microbatch's first row: its rows are row_offset ..
   * row_offset + b - 1. */
  int64_t row_offset;
  /* The job's output folder: absolute, exists, never NULL. */
  const char* output_dir;
  int32_t microbatch;
  int32_t num_microbatches;
} TrainyardInferArgs;

typedef struct TrainyardLossResult {
  /* The microbatch's loss, typically a mean over its samples. */
  double loss;
  /* This microbatch's share: the engine reports sum(w*loss)/sum(w) and
   * scales gradients to match, so with w = number of contributing samples
   * any split into microbatches gives the full-batch mean. Must be > 0
   * unless the microbatch contributes nothing (then loss and grad are 0). */
  double loss_weight;
} TrainyardLossResult;

typedef enum TrainyardEventKind {
  TRAINYARD_EVENT_STEP_BEGIN = 0,
  TRAINYARD_EVENT_STEP_END = 1,
  TRAINYARD_EVENT_CHECKPOINT_SAVED = 2,
  TRAINYARD_EVENT_JOB_END = 3,
} TrainyardEventKind;

typedef struct TrainyardEvent {
  int32_t kind; /* a TrainyardEventKind */
  int64_t step;
  const char* detail; /* checkpoint path, or job end reason; never NULL */
} TrainyardEvent;

typedef struct TrainyardTaskV1 {
  /* TRAINYARD_TASK_ABI_VERSION, and TRAINYARD_TASK_V1_SIZE_CURRENT (or
   * TRAINYARD_TASK_V1_SIZE_BASE for a table that ends at destroy,
   * TRAINYARD_TASK_V1_SIZE_CONFINED for one that ends at create_confined). */
  uint32_t abi_version;
  uint32_t struct_size;
  /* Human-readable name, e.g. "cross_entropy". */
  const char* name;

  /* Required. Parses `config_json` (a JSON object, "{}" when empty) and
   * returns a task handle, or NULL with err set when the config is refused. */
  void* (*create)(const char* config_json, TrainyardError* err);

  /* Required. First stage, once per step (and per eval batch). Adds to
   * `out` exactly one tensor named "inputs" (float32 [B, D], the model
   * input) and any number of per-sample state tensors (dim 0 == B) that
   * travel with each microbatch to compute_loss, e.g. "labels". */
  int (*build_forward_inputs)(void* task, const TrainyardBatch* batch,
                              TrainyardSink* out, TrainyardError* err);

  /* Required. Last stage, once per microbatch. Fills result and
   * args->grad_output; may record per-microbatch metrics with
   * metrics->add_metric (the host validates, then ignores them; aggregate for
   * update_metrics yourself). */
  int (*compute_loss)(void* task, const TrainyardLossArgs* args,
                      TrainyardLossResult* result, TrainyardSink* metrics,
                      TrainyardError* err);

  /* Required. Last stage, once per step (is_eval = 0) and once per eval
   * pass (is_eval = 1): reports the metrics accumulated since the previous
   * call with the same is_eval through out->add_metric, and resets them. */
  int (*update_metrics)(void* task, int32_t is_eval, TrainyardSink* out,
                        TrainyardError* err);

  /* Optional (NULL = stateless). Serialises the task's state via
   * out->add_bytes; the host stores it in checkpoints. */
  int (*state_dict)(void* task, TrainyardSink* out, TrainyardError* err);
  /* Optional (NULL = stateless). Restores what state_dict wrote. */
  int (*load_state_dict)(void* task, const void* data, size_t len,
                         TrainyardError* err);

  /* Optional event hook (NULL = not interested). */
  int (*on_event)(void* task, const TrainyardEvent* event, TrainyardError* err);

  /* Never called: superseded by infer_outputs (below). Leave it NULL; the
   * field stays so that the layout does not change. */
  int (*process_outputs)(void* task, const TrainyardLossArgs* args,
                         TrainyardSink* out, TrainyardError* err);

  /* Optional. Called once when the job ends, before destroy. */
  int (*finalize)(void* task, TrainyardError* err);

  /* Required. Frees the handle; never fails. */
  void (*destroy)(void* task);

  /* ---- Appended to v1. A plugin built before these fields sets
   * struct_size = TRAINYARD_TASK_V1_SIZE_BASE and its table ends at
   * destroy (one built before infer_outputs: TRAINYARD_TASK_V1_SIZE_CONFINED,
   * ending at create_confined); the host reads a field below only when
   * struct_size covers it, and treats it as NULL otherwise. ---- */

  /* Optional (NULL = the plugin cannot check a config without creating a
   * task). Checks the shape of `config_json` (keys, types, ranges: what
   * create would refuse before opening anything) and returns 0 when it is
   * valid, non-zero with err set otherwise. It must not open files, touch
   * devices or keep state: the host runs it where the job's files may not
   * exist (the controller, at submit), from any thread, concurrently, with
   * no task handle. A path in the config is checked for its type only. */
  int (*validate_config)(const char* config_json, TrainyardError* err);

  /* Optional (NULL = the plugin cannot confine file paths). create() for a
   * host with a data folder: `data_dir` (never NULL; absolute, symlinks
   * resolved) is the folder every file path in `config_json` must stay
   * inside once resolved, symlinks included. A relative path resolves
   * against it (or against a folder key of the plugin's own, itself
   * resolved against it). A path that leaves it is refused, with err naming
   * the key (`task.config.<key>`) and the folder, before the file is opened.
   * A host with a data folder calls this instead of create; when it is
   * NULL, the host refuses every config but an empty object. */
  void* (*create_confined)(const char* config_json, const char* data_dir,
                           TrainyardError* err);

  /* Optional (NULL = the plugin cannot run inference jobs; the host refuses
   * such a job naming the plugin). Last stage, once per microbatch of an
   * inference job (a job spec with "kind": "infer"), after
   * build_forward_inputs ran with is_eval = 1 on the first stage. Adds to
   * `out`, with add_tensor only, the microbatch's outputs: each named
   * (non-empty, [A-Za-z0-9_]+: the name is used as a file name), float32,
   * int32 or int64, ndim >= 1, dim 0 == b (row i is data row
   * args->row_offset + i). Every call must add the same names with the same
   * dtypes and trailing dims (all but dim 0).
   * The host writes them in row order into args->output_dir as .npy shards;
   * the files `manifest.json` and `shard-*` there are the host's. The
   * plugin may write files of its own into output_dir under other names,
   * must tolerate being called again for rows it has seen (a resumed job
   * recomputes the shard that was not finished), and must not rely on the
   * order of microbatches across replicas. An error about a row names the
   * data row (row_offset + i), not the row within the microbatch. */
  int (*infer_outputs)(void* task, const TrainyardInferArgs* args,
                       TrainyardSink* out, TrainyardError* err);
} TrainyardTaskV1;

/* The struct_size values a v1 host accepts: the first layout (ending at
 * destroy), the layout ending at create_confined, and the current one
 * (ending at infer_outputs). Any other is refused. */
#define TRAINYARD_TASK_V1_SIZE_BASE \
  ((uint32_t)offsetof(TrainyardTaskV1, validate_config))
#define TRAINYARD_TASK_V1_SIZE_CONFINED \
  ((uint32_t)offsetof(TrainyardTaskV1, infer_outputs))
#define TRAINYARD_TASK_V1_SIZE_CURRENT ((uint32_t)sizeof(TrainyardTaskV1))

/* The one symbol a v1 plugin exports. */
typedef const TrainyardTaskV1* (*TrainyardTaskV1Entry)(void);

/* ---- Version 2: the loss on the device ---------------------------------
 *
 * A stage on a device (a CUDA GPU, or the simulated device that tests a GPU
 * step on a CPU) keeps the model's output where it is: the plugin's
 * compute_loss_device enqueues the loss of one microbatch on the stage's
 * stream and returns. It never waits for the device and never reads device
 * memory on the host. What the host needs back it writes into the
 * microbatch's slots: a few doubles in device memory, which the host reads
 * once per step (with every other microbatch's and the step's other
 * scalars) and then hands to finish_loss on the host, microbatch by
 * microbatch, in order.
 *
 * The task handle and every host call (create, build_forward_inputs,
 * update_metrics, state_dict, on_event, finalize, destroy) are the v1
 * table's: v2 only adds the device half. The v2 entry returns a table that
 * points at the plugin's v1 table.
 *
 * Lifecycle of a step on a device stage:
 *   build_forward_inputs (first stage, host; skipped with
 *     TRAINYARD_V2_PASSTHROUGH_INPUTS) -> compute_loss_device x M (last
 *     stage, enqueued) -> [the host reads the slots] -> finish_loss x M
 *     (host, in microbatch order) -> update_metrics
 */
#define TRAINYARD_TASK_ABI_VERSION_2 2
#define TRAINYARD_TASK_SYMBOL_V2 "trainyard_task_v2"

typedef enum TrainyardDeviceKind {
  /* CUDA: tensor and slot pointers are device pointers on the calling
   * thread's current device; `stream` is the cudaStream_t to enqueue on. */
  TRAINYARD_DEVICE_CUDA = 1,
  /* The simulated device: pointers are host addresses that stand for device
   * memory; compute on the calling thread (with the CPU) before returning;
   * `stream` is NULL. */
  TRAINYARD_DEVICE_SIM = 2,
} TrainyardDeviceKind;

/* The slots of one microbatch: num_slots doubles in device memory, zeroed
 * by the host before compute_loss_device. The first four have fixed
 * meanings (the host reads the first two itself); the rest are the
 * plugin's own partials for its metrics. */
#define TRAINYARD_SLOT_WEIGHT 0 /* loss_weight w >= 0 (v1's loss_weight) */
#define TRAINYARD_SLOT_WEIGHTED_LOSS 1 /* w * loss */
/* 0, or 1 + the index of the first bad input (a label out of range, say):
 * finish_loss must then fail with a message naming it. */
#define TRAINYARD_SLOT_BAD 2
#define TRAINYARD_SLOT_BAD_VALUE 3 /* that input's value, for the message */
#define TRAINYARD_SLOT_FIRST_METRIC 4
#define TRAINYARD_MAX_SLOTS 64

/* Input of compute_loss_device, for one microbatch on the last stage. Every
 * pointer is valid for the call only; the memory behind the device
 * pointers stays valid until the work the call enqueued has run. */
typedef struct TrainyardDeviceLossArgs {
  int32_t device_kind;  /* a TrainyardDeviceKind */
  int32_t device_index; /* the GPU's ordinal; 0 on the simulated device */
  void* stream;         /* CUDA: the cudaStream_t; simulated: NULL */
  /* Device, float32 or bfloat16 (the job's activation dtype) [b, out]. */
  const TrainyardTensor* output;
  /* Device: this microbatch's rows of every state tensor (dim 0 == b), in
   * the order build_forward_inputs added them; with
   * TRAINYARD_V2_PASSTHROUGH_INPUTS the batch's own tensors but
   * "features" (e.g. "targets", int32/int64 [b] or float32 [b, K]), as the
   * data source holds them. */
  const TrainyardTensor* state;
  int32_t num_state;
  /* Device, the dtype and shape of *output: the plugin writes every
   * element with the gradient of w * loss (loss_weight times
   * dLoss/dOutput). NULL data when is_eval. */
  TrainyardTensor* grad_output;
  double* slots;   /* device, num_slots doubles, zeroed */
  void* workspace; /* device scratch of workspace_bytes(...) bytes */
  size_t workspace_bytes;
  int64_t step; /* 0-based optimizer step (the eval batch index for evals) */
  int32_t microbatch;
  int32_t num_microbatches;
  int32_t is_eval;
} TrainyardDeviceLossArgs;

/* Flags of TrainyardTaskV2. */
/* The host skips build_forward_inputs on device stages and gathers each
 * step's rows on the device itself: the model input is the batch's
 * "features" and compute_loss_device's state is the batch's other tensors
 * (e.g. "targets"), unchanged, under their own names. (The plugin's v1
 * build_forward_inputs still serves host stages and may produce other
 * state.) */
#define TRAINYARD_V2_PASSTHROUGH_INPUTS 1u

typedef struct TrainyardTaskV2 {
  /* TRAINYARD_TASK_ABI_VERSION_2 and sizeof(TrainyardTaskV2). */
  uint32_t abi_version;
  uint32_t struct_size;
  /* Required: the table trainyard_task_v1 returns (the task handle and
   * the host calls). */
  const TrainyardTaskV1* v1;
  uint32_t flags;     /* TRAINYARD_V2_* */
  uint32_t num_slots; /* per microbatch, 4 .. TRAINYARD_MAX_SLOTS */

  /* Required. Bytes of device workspace compute_loss_device needs for an
   * output of rows x cols (0 for none). Host only; must not fail. */
  size_t (*workspace_bytes)(void* task, int64_t rows, int64_t cols);

  /* Required. Enqueues the loss of one microbatch: fills the slots and,
   * unless is_eval, every element of grad_output. Checks what it can on the
   * host (dtypes, shapes, state names) and fails with err set; inputs it
   * cannot check without reading device memory (label values) it checks on
   * the device, reporting the first bad one in TRAINYARD_SLOT_BAD. Must not
   * synchronise with the device or read device memory on the host. */
  int (*compute_loss_device)(void* task, const TrainyardDeviceLossArgs* args,
                             TrainyardError* err);

  /* Required. Host, once per microbatch in microbatch order, after the host
   * read the step's (or eval batch's) slots: `slots` is this microbatch's
   * num_slots doubles as the device left them (host memory). Fails with the
   * message compute_loss would have given when TRAINYARD_SLOT_BAD is set;
   * otherwise accumulates the metric partials for update_metrics. May
   * record per-microbatch metrics through metrics->add_metric (validated,
   * then ignored, as for compute_loss). */
  int (*finish_loss)(void* task, const double* slots, int64_t step,
                     int32_t microbatch, int32_t num_microbatches,
                     int32_t is_eval, TrainyardSink* metrics,
                     TrainyardError* err);
} TrainyardTaskV2;

/* The symbol a v2 plugin exports beside trainyard_task_v1. */
typedef const TrainyardTaskV2* (*TrainyardTaskV2Entry)(void);

#ifdef __cplusplus
}
#endif

#endif /* TRAINYARD_TASK_PLUGINS_TASK_ABI_H_ */
