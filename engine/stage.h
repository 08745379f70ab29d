// Stage: one pipeline stage of a training job — the engine every worker
// runs, on the CPU or a GPU.
//
// A Stage interprets its list of the job's Schedule (schedule/schedule.h) for
// each optimizer step: forward, backward-input, backward-weight, sends and
// receives of activations and gradients through a Transport. The work is
// done by its parts, each in its own unit:
//   ParamStore (engine/param_store.h)  parameters and gradients, init;
//   BlockKernel (kernels/block_kernel.h) the blocks, on the stage's device;
//   LossHead (engine/loss_head.h)      the loss, on the last stage;
//   ReduceStep (engine/step_reducer.h) loss, global norm and clip scale
//                                      from one small all-reduce;
//   StageOptimizer (engine/optimizer.h) the stage-local update.
// The first stage also owns the batch sampler and turns raw rows into model
// inputs through the task plugin.
//
// Loss combination: microbatch i returns loss L_i with weight w_i; the step
// loss is sum(w_i L_i) / sum(w_i). Backward is seeded with w_i * dL_i/dOut
// and the accumulated gradients are scaled by 1 / sum(w_i) (folded into the
// optimizer step together with the clip coefficient), which gives exactly
// the full-batch mean's gradient without knowing sum(w_i) in advance.
//
// Model chunks: under "interleaved" and "zbv" a stage holds several
// chunks (virtual stages, schedule/schedule.h), each with its own blocks and
// microbatches in flight. Messages name the chunk they are for; a stage
// receives from one neighbour messages for several of its chunks in
// whatever order they were sent, so a receive keeps the ones it was not
// waiting for until their own receive comes (a hand-off between two chunks
// of one stage, the tip of the V, goes there directly). The data enter on
// stage 0; the loss is on the stage holding the last virtual stage (stage 0
// under "zbv").
//
// Devices: a stage computes where its ExecContext says. Messages carry
// device tensors only over a transport that shares device memory (the
// in-process one); otherwise they are staged through the host. A step on a
// device (CUDA or simulated) waits for the device once: its small numbers
// (loss slots, gradient sums of squares, checks) live in one device buffer
// (engine/step_scalars.h) read when the host needs them — before the
// pipeline's all-reduce, or, for a one-stage one-replica job whose loss
// runs on the device, after the optimizer is queued (the totals and the
// clip scale computed on the device; the update skipped there when the step
// fails). A first stage whose plugin passes its inputs through keeps the
// data set on the device and gathers each batch's rows there: no
// activation-sized copy between host and device inside a step.
//
// Thread safety: a Stage is used by one thread. Stages of one job talk only
// through their Transports.
#ifndef TRAINYARD_ENGINE_STAGE_H_
#define TRAINYARD_ENGINE_STAGE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/safetensors.h"
#include "engine/dataset.h"
#include "engine/gradient_tree.h"
#include "engine/loss_head.h"
#include "engine/optimizer.h"
#include "engine/param_store.h"
#include "engine/replica_group.h"
#include "engine/shared_device_replicas.h"
#include "engine/stage_report.h"
#include "engine/step_reducer.h"
#include "engine/step_scalars.h"
#include "engine/task_loader.h"
#include "kernels/block_kernel.h"
#include "kernels/exec_context.h"
#include "kernels/stream_timer.h"
#include "plan/job_plan.h"
#include "proto/trainyard.pb.h"
#include "schedule/schedule.h"
#include "transport/transport.h"

namespace trainyard {

struct StageOptions {
  std::string plugin_dir;  // where lib<task.plugin>.so lives
  // File paths in task.config must resolve inside this folder (the
  // worker's --data_dir; docs/PLUGIN_ABI.md); "" = not confined.
  std::string data_dir;
  // Where the stage computes; null: the CPU in fp32 (a context the stage
  // owns). Must outlive the stage.
  const ExecContext* exec = nullptr;
  // Longest wait for a neighbour or the all-reduce before failing.
  absl::Duration timeout = absl::Minutes(2);
  // parallelism.replicas R > 1: the replica this stage belongs to (it runs
  // microbatches [replica M/R, (replica + 1) M/R) of every step) and the
  // group of this stage's copies in all R replicas, through which their
  // gradients and losses are summed (not owned; must outlive the stage).
  int replica = 0;
  ReplicaGroup* replica_group = nullptr;
  // Replicas that are threads of one process on one device (CUDA or
  // simulated): their gradients are summed there, through each other's
  // buffers, instead of through the host and replica_group (which still
  // gathers the loss terms). Not owned; shared by the stage's replicas.
  SharedDeviceReplicas* device_replicas = nullptr;
  // The training schedule to run instead of the one the spec names: any
  // valid schedule (ValidateSchedule) for the plan's stages, chunks and
  // layout and this replica's microbatches. Every stage of a job must get
  // the same one.
  std::optional<Schedule> schedule;
  // The largest data set (train and eval features and targets, in bytes)
  // the first stage of a device job keeps on its device, gathering each
  // batch's rows there (plugins whose inputs pass through, task ABI v2):
  // -1 automatic (a quarter of the GPU's free memory; any size on the
  // simulated device), 0 never (rows are gathered on the host and copied).
  int64_t device_data_bytes = -1;
  // Device stages use the task plugin's host loss (ABI v1) even when it has
  // a device loss: two copies of each microbatch's output and gradient.
  // For comparing the two halves of a plugin.
  bool host_loss = false;
};

// Data a stage needs. Only the first stage reads rows; every stage needs
// the eval row count to run the same number of eval batches.
struct StageData {
  std::shared_ptr<const Dataset> train;  // first stage only
  std::shared_ptr<const Dataset> eval;   // first stage only; may be null
  int64_t eval_rows = 0;                 // every stage
};

class Stage {
 public:
  // Builds stage `index` of `plan`: blocks, buffers, optimizer, schedules
  // (validated), and the task plugin on the first/last stage. Parameters
  // are uninitialised until InitParameters or RestoreCheckpoint.
  static absl::StatusOr<std::unique_ptr<Stage>> Create(
      const JobPlan& plan, int index, Transport* transport,
      const StageOptions& options, StageData data);
  ~Stage();

  // Seeded init or model.init.safetensors (see ParamStore::Init).
  absl::Status InitParameters();

  // Runs the next optimizer step.
  absl::StatusOr<StepReport> RunStep();

  // Forward-only pass over the whole eval set (batches of data.batch_size).
  absl::StatusOr<EvalReport> RunEval();

  // This stage's file of the checkpoint for the completed step count, as
  // host copies that later steps do not change (see
  // docs/CHECKPOINT_FORMAT.md): parameters, optimizer state, task state,
  // metadata.
  // With `stable` false, host tensors are the live buffers themselves (no
  // copy): for a caller that is done with them before the next step.
  absl::StatusOr<SafetensorsFile> CheckpointContents(bool stable = true) const;
  // Writes CheckpointContents() into `dir`. Returns its SHA-256.
  absl::StatusOr<std::string> WriteCheckpointFile(const std::string& dir);
  // What this stage tells the next step's all-reduce about the pending
  // asynchronous checkpoint (StepReport::checkpoint_files_written).
  void set_checkpoint_file_written(bool written) {
    checkpoint_file_written_ = written;
  }

  // Loads the parameters, optimizer state, data position and task state of
  // checkpoint `step` in `dir`. Parameters are found by name in any of the
  // checkpoint's stage files, so a checkpoint written with another stage
  // split loads too.
  absl::Status RestoreCheckpoint(const std::string& dir, int64_t step);
  // The same from an in-memory snapshot: this stage's CheckpointContents()
  // after `step`, serialized (SerializeSafetensors). DataLoss when it does
  // not parse, is another stage's or step's, or does not fit this stage.
  absl::Status RestoreSnapshot(absl::string_view bytes, int64_t step);

  // Where snapshots that neighbours send between steps (MessageKind::
  // kSnapshot) go when they turn up among the step's messages; without a
  // sink they are an error. Errors from the sink fail the step.
  void set_snapshot_sink(
      std::function<absl::Status(int peer, Message message)> sink) {
    snapshot_sink_ = std::move(sink);
  }

  // Tells the task plugin (if any) about a lifecycle event.
  absl::Status NotifyTask(TrainyardEventKind kind, const std::string& detail);
  // The same for an event about step `step` (e.g. the checkpoint taken
  // after it) rather than the current one.
  absl::Status NotifyTask(TrainyardEventKind kind, const std::string& detail,
                          int64_t step);
  // Calls the task's finalize (once).
  absl::Status Finalize();

  int index() const { return index_; }
  // Holds virtual stage 0: reads the data (stage 0).
  bool is_first() const { return index_ == 0; }
  // Holds the last virtual stage: computes the loss and the task's metrics
  // (stage S - 1; stage 0 under "zbv").
  bool is_last() const { return plan_.loss_stage() == index_; }
  int64_t completed_steps() const { return completed_steps_; }

  // This stage's parameters by global name (views of the flat buffer, on
  // the stage's device).
  NamedTensors NamedParameters() const;
  // Host copies (the views themselves on the CPU).
  absl::StatusOr<NamedTensors> NamedParametersOnHost() const;
  const ExecContext& exec() const { return *ctx_; }

 private:
  // Loads parameters, optimizer state, data position and task state from
  // `files` (tensors found by name in any of them) as the state after
  // `step`; `where` names the source in errors.
  absl::Status RestoreState(std::vector<SafetensorsFile> files, int64_t step,
                            const std::string& where);
  Stage() = default;
  struct Microbatch;
  // One of the stage's model chunks: a virtual stage.
  struct Chunk {
    int virtual_stage = 0;
    int first_block = 0;  // global index of blocks_[local_begin]
    int local_begin = 0;  // its blocks are blocks_[local_begin, local_end)
    int local_end = 0;
    // Its part of the stage's flat gradient buffer, and the tree that sums
    // that part over microbatches (accumulation "tree").
    int64_t grad_offset = 0;
    int64_t grad_size = 0;
    std::optional<GradientTree> tree;
  };
  using Clock = std::chrono::steady_clock;
  // Which message a receive waits for: kind, chunk, microbatch.
  using MessageKey = std::tuple<MessageKind, int, int>;

  // Steps time each action (SpanTimer); evals do not.
  absl::Status RunSchedule(const Schedule& schedule, int64_t step, bool is_eval,
                           int num_microbatches);
  absl::Status Forward(Microbatch* mb, bool save_for_backward);
  absl::Status BackwardInput(Microbatch* mb);
  absl::Status BackwardWeight(Microbatch* mb);
  absl::Status OptimizerStep(int64_t step, StepReport* report);
  // A device step's one read of its scalars (recording the read's mark).
  absl::Status ReadScalars();
  // OptimizerStep of a device stage (scalars_).
  absl::Status DeviceOptimizerStep(int64_t step, StepReport* report);
  // Given this stage's sums of squares in `mine`: the step's all-reduce
  // (ReduceStep) and the update with the scale it gives.
  absl::Status ReduceAndUpdate(int64_t step, StepContributions mine,
                               StepReport* report);
  // The first stage of a device job: the data set to the device when the
  // plugin passes its inputs through and it fits in `limit` bytes (-1:
  // automatic, see StageOptions::device_data_bytes).
  absl::Status UploadData(int64_t limit);
  // Splits `rows` into `num_microbatches` and loads microbatches
  // [first, first + count) into microbatches_[0, count).
  absl::Status PrepareBatch(const Dataset& data, std::vector<int64_t> rows,
                            int64_t step, bool is_eval, int num_microbatches,
                            int first, int count);
  // Replicas: sums the gradients across the replica group (tree order).
  absl::Status SumReplicaGradients();
  // Sends `msg` to virtual stage `virtual_stage`, setting its chunk; a
  // chunk of this stage gets it directly (held_).
  absl::Status Send(int virtual_stage, Message msg);
  // The `kind` message for microbatch mb (its chunk and index) from virtual
  // stage `virtual_stage`, with its first tensor on this stage's device.
  // Messages for other microbatches or chunks that arrive first are held.
  absl::StatusOr<Message> Receive(int virtual_stage, MessageKind kind,
                                  int64_t step, const Microbatch& mb);
  // Sets up microbatches_: `count` per chunk.
  void ResetMicrobatches(int count);
  Microbatch& MicrobatchAt(int chunk, int index);
  std::string Where() const;  // "stage 2"

  // Timing (kernels/stream_timer.h). A span is two marks on the step's
  // StreamTimer, resolved into the report's phases and trace once the
  // device has passed them: at the end of the step on the CPU; after the
  // step's read on a device. What a device stage queues after its read
  // (the all-reduce and the update of a multi-stage job) is resolved at the
  // next step's read and counted in that step's phases, not its trace.
  class SpanTimer;
  struct PendingSpan {
    int timer = 0;  // timers_ index
    SpanKind kind = v1::SPAN_FORWARD;
    int microbatch = -1;
    int start = -1, end = -1;             // marks
    double StageTimes::*phase = nullptr;  // may be null
    bool traced = true;
  };
  // A mark on the current step's timer (-1 after an error, kept for
  // ResolveSpans to return).
  int TimingMark();
  // Resolves the carried spans and the pending ones whose marks are <=
  // `upto` (all for -1) into report; the rest are carried.
  absl::Status ResolveSpans(int upto, StepReport* report);

  JobPlan plan_;
  int index_ = 0;
  int num_stages_ = 1;
  Transport* transport_ = nullptr;
  StageOptions options_;
  StageData data_;
  std::unique_ptr<ExecContext> own_ctx_;  // when options.exec is null
  const ExecContext* ctx_ = nullptr;

  // This stage's blocks, chunk after chunk.
  std::vector<std::unique_ptr<BlockKernel>> blocks_;
  std::vector<Chunk> chunks_;
  std::optional<ParamStore> store_;
  std::vector<bool> grads_written_;  // per local block, this step
  bool tree_accumulation_ = false;   // parallelism.accumulation "tree"
  // Data parallelism (StageOptions::replica, replica_group).
  int replicas_ = 1;
  int replica_ = 0;
  ReplicaGroup* replica_group_ = nullptr;
  // This step's first microbatch in the whole step's numbering (replica
  // r starts at r M/R); microbatches_ holds this replica's M/R.
  int first_microbatch_ = 0;
  std::optional<StageOptimizer> optimizer_;

  std::unique_ptr<Task> task_;             // first and/or last stage
  std::unique_ptr<BatchSampler> sampler_;  // first stage
  // Device stages: the step's small numbers, read once per step.
  std::optional<StepScalars> scalars_;
  std::optional<LossHead> loss_;  // last stage (may point into scalars_)
  // One stage, one replica, its loss on the device: the totals and the
  // clip scale are computed on the device (DeviceOptimizerStep).
  bool device_totals_ = false;
  // The first stage's data on the device (UploadData), and the pinned
  // host buffer and device buffer of a batch's row indices.
  struct DeviceData {
    Tensor train_features, train_targets, eval_features, eval_targets;
    Tensor rows_host, rows;
  };
  std::optional<DeviceData> device_data_;
  Schedule train_schedule_;

  // [chunk * per_chunk_ + index]: this step's microbatches on each chunk.
  std::vector<Microbatch> microbatches_;
  int per_chunk_ = 0;
  // Messages that arrived before their receive (Receive).
  std::map<MessageKey, Message> held_;
  int64_t completed_steps_ = 0;
  // Where the current (or last) step began on the host clock: the eval
  // span is timed from here.
  std::optional<Clock::time_point> step_origin_;
  // Two timers, used by alternate steps, so that a step's carried marks
  // survive the next step's Start.
  std::unique_ptr<StreamTimer> timers_[2];
  int timer_ = 0;        // the current step's
  bool timing_ = false;  // inside RunStep
  int read_mark_ = -1;   // this step's read, on a device
  std::vector<PendingSpan> pending_;
  std::vector<PendingSpan> carried_;
  absl::Status timing_error_;
  bool finalized_ = false;
  bool checkpoint_file_written_ = false;
  std::function<absl::Status(int peer, Message message)> snapshot_sink_;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_STAGE_H_
