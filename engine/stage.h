// Stage: one pipeline stage of a job — the engine every worker runs, on the
// CPU or a GPU. A training job's stage runs optimizer steps; an infer or
// eval job's (engine/forward_job.h) runs forward only, with no optimizer.
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
//   StageOptimizer (engine/optimizer.h) the stage-local update;
//   StepTracer (engine/step_tracer.h)  the steps' phases and traces.
// The first stage also owns the batch sampler and turns raw rows into model
// inputs through the task plugin; over a sharded source, a BatchReader
// (engine/batch_reader.h) reads the next batches' rows while a step runs. What
// a step or an eval reports is in engine/stage_report.h. Stage's own methods
// are defined by concern:
//   stage.cc             construction, parameters, task events;
//   stage_step.cc        a step and an eval from start to end (forward-only
//                        batches), the optimizer step;
//   stage_passes.cc      batches into microbatches, forward and backward;
//   stage_schedule.cc    the schedule's actions, sends and receives;
//   stage_checkpoint.cc  checkpoint contents and restore;
//   stage_inference.cc   an inference job's pass, an infer or eval job's
//                        model.
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

#include <atomic>
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
#include "engine/batch_reader.h"
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
#include "engine/step_tracer.h"
#include "engine/task_loader.h"
#include "kernels/block_kernel.h"
#include "kernels/exec_context.h"
#include "plan/job_plan.h"
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

// Splits `rows` rows into `parts` contiguous microbatches [first, second)
// whose sizes differ by at most one (the first rows % parts get one more).
std::vector<std::pair<int64_t, int64_t>> MicrobatchRanges(int64_t rows,
                                                          int parts);

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
  // An eval job's whole work.
  absl::StatusOr<EvalReport> RunEval();

  // Where an inference job's last stage hands each microbatch's outputs
  // (the task's infer_outputs, host tensors), with the data row of its
  // first row.
  using InferSink = std::function<absl::Status(int64_t row, NamedTensors)>;
  // An inference job's forward-only pass over rows [begin, end) of its
  // rows (StageData::eval), in batches of data.batch_size from `begin`,
  // each cut into microbatches as an eval batch is, so a row's microbatch
  // does not depend on the stage or replica count. `first_tag` numbers the
  // batches' messages (every stage of the pipeline passes the same). The
  // last stage calls `sink` once per microbatch, in row order; a sink error
  // or the plugin's refusal (naming the rows) fails the pass.
  // `cancel` (may be null), checked before each batch, stops the pass with
  // Cancelled.
  absl::Status RunInference(int64_t begin, int64_t end, int64_t first_tag,
                            const InferSink& sink,
                            const std::atomic<bool>* cancel = nullptr);

  // An infer or eval job's model: the parameters of checkpoint `step` in
  // `dir` (a training job's, with any stage count), found by name in any of
  // its stage files, and nothing else of it. Refused before any row is
  // read: a parameter missing, of another shape or dtype (naming it), or a
  // block parameter the spec's model does not have. Afterwards
  // completed_steps() is `step`.
  absl::Status LoadModel(const std::string& dir, int64_t step);

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
  // One microbatch in flight on this stage.
  struct Microbatch {
    int chunk = 0;
    int index = 0;
    Tensor input;  // [b, in] this stage's input
    // Task state, travels with the microbatch: on the host, or on the
    // device for a device loss.
    NamedTensors state;
    Tensor output;       // [b, out] this stage's output
    Tensor grad_output;  // [b, out] dLoss/dOutput (scaled)
    Tensor grad_input;   // [b, in]  to send back
    std::vector<std::unique_ptr<BlockSaved>> saved;  // per block of the chunk
    // After its weight pass: what the backward passes kept is no longer
    // needed.
    void ReleaseSaved() {
      saved.clear();
      input = Tensor();
    }
  };
  // One of the stage's model chunks: a virtual stage.
  struct Chunk {
    int virtual_stage = 0;
    int first_block = 0;  // global index of blocks_[local_begin]
    int local_begin = 0;  // its blocks are blocks_[local_begin, local_end)
    int local_end = 0;
    // Its part of the stage's flat gradient buffer, and the tree that sums
    // that part over microbatches (accumulation "tree", two microbatches
    // or more per replica).
    int64_t grad_offset = 0;
    int64_t grad_size = 0;
    std::optional<GradientTree> tree;
  };
  // The first stage's data on the device (UploadData), and the pinned
  // host buffer and device buffer of a batch's row indices.
  struct DeviceData {
    Tensor train_features, train_targets, eval_features, eval_targets;
    Tensor rows_host, rows;
  };
  // Which message a receive waits for: kind, chunk, microbatch.
  using MessageKey = std::tuple<MessageKind, int, int>;

  Stage() = default;
  std::string Where() const;  // "stage 2"
  // FailedPrecondition naming `what` unless the job trains (an infer or
  // eval job has no optimizer, sampler or checkpoints).
  absl::Status CheckTrains(const char* what) const;

  // Construction (stage.cc), in the order Create runs them.
  // The stage's ExecContext (StageOptions::exec, or a CPU one of its own),
  // activated, and the step tracer on it.
  absl::Status SetUpDevice();
  // Each chunk's blocks, on the stage's device.
  absl::Status CreateBlocks();
  // The parameter store, each chunk's part of the gradient buffer and, with
  // accumulation "tree" and two microbatches or more per replica, each
  // chunk's tree.
  absl::Status CreateParamStore();
  // Data parallelism: the replica and its group, checked.
  absl::Status SetUpReplicas();
  // The training schedule (StageOptions::schedule when it fits this job,
  // else the spec's), validated.
  absl::Status SetUpSchedule();
  // The task (first and last stage), the step's scalars (device stages)
  // and the loss head (last stage).
  absl::Status SetUpTask();
  // The first stage's batch sampler, and its data set on the device when
  // it goes there.
  absl::Status SetUpData();
  // Whether the task's loss runs on the device of a device stage: the
  // plugin has a device loss and StageOptions::host_loss is off.
  bool PluginLossOnDevice() const;
  // The first stage of a device job: the data set to the device when the
  // plugin passes its inputs through and it fits in `limit` bytes (-1:
  // automatic, see StageOptions::device_data_bytes).
  absl::Status UploadData(int64_t limit);
  // The first stage of a training job over a sharded source: its read-ahead
  // (reader_), reading this replica's part of each batch.
  absl::Status StartReader();
  // Whether the task's inputs are its raw rows and its state their targets
  // on this stage's device: the plugin passes its inputs through to a loss
  // on the device (so rows can be gathered and widened there).
  bool InputsPassThroughOnDevice() const;

  // The step (stage_step.cc).
  // Brackets passes over unchanged parameters that read each weight
  // `weight_reads` times (BlockKernel::BeginPasses: the CPU blocks keep
  // their weights packed from one GEMM to the next in between): a step's
  // passes (each microbatch's forward and input gradient), ended before its
  // optimizer step; each eval or inference run (each microbatch's forward).
  void BeginPasses(int weight_reads);
  void EndPasses();
  // The weight passes the schedule asked for this step, chained (plan/
  // job_plan.h, ChainsWeightPasses): one BlockKernel::BackwardWeights per
  // block over the microbatches in order, traced as one "backward weight"
  // span of no microbatch (-1).
  absl::Status RunChainedWeightPasses();
  // Checks that every block got a weight gradient and folds each chunk's
  // tree into the gradient buffer.
  absl::Status FinishGradients();
  // Replicas: sums the gradients across the replica group (tree order).
  absl::Status SumReplicaGradients();
  absl::Status OptimizerStep(int64_t step, StepReport* report);
  // OptimizerStep of a device stage (scalars_).
  absl::Status DeviceOptimizerStep(int64_t step, StepReport* report);
  // DeviceOptimizerStep of a stage whose totals are computed on the device
  // (device_totals_).
  absl::Status DeviceTotalsStep(int64_t step, StepReport* report);
  // Given this stage's sums of squares in `mine`: the step's all-reduce
  // (ReduceStep) and the update with the scale it gives.
  absl::Status ReduceAndUpdate(int64_t step, StepContributions mine,
                               StepReport* report);
  // A device step's one read of its scalars (recording the read's mark).
  absl::Status ReadScalars();

  // The passes (stage_passes.cc).
  // Splits `rows` into `num_microbatches` and loads microbatches
  // [first, first + count) into microbatches_[0, count). `position` >= 0:
  // the rows are the training sampler's at that position (what reader_
  // reads ahead); -1: any other rows.
  absl::Status PrepareBatch(const Dataset& data, std::vector<int64_t> rows,
                            int64_t position, int64_t step, bool is_eval,
                            int num_microbatches, int first, int count);
  // The rows' features and targets on the host: reader_'s batch at
  // `position`, or gathered now; timed as the step's data wait.
  absl::StatusOr<BatchReader::Batch> ReadRows(const Dataset& data,
                                              const std::vector<int64_t>& rows,
                                              int64_t position);
  // A batch of reader_'s (pinned, features at their stored width) to model
  // inputs on the device: copied as it is and widened there.
  absl::StatusOr<ForwardInputs> InputsOnDevice(const BatchReader::Batch& raw);
  // The model inputs and task state of `rows`, gathered on the device from
  // device_data_.
  absl::StatusOr<ForwardInputs> GatherOnDevice(const std::vector<int64_t>& rows,
                                               bool is_eval);
  // The model inputs and task state of host rows `raw` (float32 features),
  // built by the task plugin, then copied to the device.
  absl::StatusOr<ForwardInputs> BuildOnHost(const BatchReader::Batch& raw,
                                            int64_t step, bool is_eval);
  absl::Status Forward(Microbatch* mb, bool save_for_backward);
  absl::Status BackwardInput(Microbatch* mb);
  absl::Status BackwardWeight(Microbatch* mb);

  // Forward-only batches (stage_step.cc): rows [begin, end) of the job's
  // eval rows in batches of data.batch_size, batch k's messages tagged
  // first_tag + k; on a device loss, each batch's loss slots read and
  // finished.
  absl::Status ForwardBatches(int64_t begin, int64_t end, int64_t first_tag);
  // An inference job's last virtual stage: the microbatch's output and
  // state to the host, through the task's infer_outputs, to infer_sink_.
  absl::Status InferMicrobatch(Microbatch* mb);

  // The schedule interpreter (stage_schedule.cc).
  // Steps time each action (SpanTimer); evals do not.
  absl::Status RunSchedule(const Schedule& schedule, int64_t step, bool is_eval,
                           int num_microbatches);
  // One action of the schedule, but the optimizer step (RunStep's).
  absl::Status RunAction(const Action& action, int64_t step, bool is_eval,
                         int num_microbatches);
  // kForward: the chunk's forward pass, and on the last virtual stage the
  // loss, which leaves the microbatch's w * dLoss/dOutput.
  absl::Status ForwardAndLoss(Microbatch* mb, bool is_eval,
                              int num_microbatches);
  absl::Status SendActivation(Microbatch* mb, MessageKind kind, int64_t step);
  absl::Status SendGradient(Microbatch* mb, int64_t step);
  // Sets up microbatches_: `count` per chunk.
  void ResetMicrobatches(int count);
  Microbatch& MicrobatchAt(int chunk, int index);
  // Sends `msg` to virtual stage `virtual_stage`, setting its chunk; a
  // chunk of this stage gets it directly (held_).
  absl::Status Send(int virtual_stage, Message msg);
  // The `kind` message for microbatch mb (its chunk and index) from virtual
  // stage `virtual_stage`, with its first tensor on this stage's device.
  // Messages for other microbatches or chunks that arrive first are held.
  absl::StatusOr<Message> Receive(int virtual_stage, MessageKind kind,
                                  int64_t step, const Microbatch& mb);
  // Receive's wait: sets *msg to the message `want` from stage `peer` (or
  // to the first one no later receive can take, or to the error), holding
  // the others and handing snapshots to the sink. Returns the sink's error.
  absl::Status AwaitMessage(int peer, const MessageKey& want, int64_t step,
                            absl::StatusOr<Message>* msg);

  // Checkpoint state (stage_checkpoint.cc).
  // Loads parameters, optimizer state, data position and task state from
  // `files` (tensors found by name in any of them) as the state after
  // `step`; `where` names the source in errors.
  absl::Status RestoreState(std::vector<SafetensorsFile> files, int64_t step,
                            const std::string& where);

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
  // ChainsWeightPasses(plan_) on a CPU that runs its microbatches on the
  // packed GEMM: the schedule's weight passes only queue their microbatch
  // in chained_weight_passes_, run by RunChainedWeightPasses.
  bool chain_weight_passes_ = false;
  std::vector<Microbatch*> chained_weight_passes_;
  // Data parallelism (StageOptions::replica, replica_group).
  int replicas_ = 1;
  int replica_ = 0;
  ReplicaGroup* replica_group_ = nullptr;
  // During RunInference: the sink, and the data row each microbatch of the
  // batch in flight starts at.
  const InferSink* infer_sink_ = nullptr;
  const std::atomic<bool>* infer_cancel_ = nullptr;
  std::vector<int64_t> microbatch_rows_;
  // This step's first microbatch in the whole step's numbering (replica
  // r starts at r M/R); microbatches_ holds this replica's M/R.
  int first_microbatch_ = 0;
  std::optional<StageOptimizer> optimizer_;

  std::unique_ptr<Task> task_;             // first and/or last stage
  std::unique_ptr<BatchSampler> sampler_;  // first stage
  // First stage of a training job over a sharded source (else null).
  // Its batches keep the files' width when InputsPassThroughOnDevice().
  std::unique_ptr<BatchReader> reader_;
  // Device stages: the step's small numbers, read once per step.
  std::optional<StepScalars> scalars_;
  std::optional<LossHead> loss_;  // last stage (may point into scalars_)
  // One stage, one replica, its loss on the device: the totals and the
  // clip scale are computed on the device (DeviceTotalsStep).
  bool device_totals_ = false;
  std::optional<DeviceData> device_data_;
  Schedule train_schedule_;

  // [chunk * per_chunk_ + index]: this step's microbatches on each chunk.
  std::vector<Microbatch> microbatches_;
  int per_chunk_ = 0;
  // Messages that arrived before their receive (Receive).
  std::map<MessageKey, Message> held_;
  int64_t completed_steps_ = 0;
  // The steps' phases and traces, and the origin of an eval's span.
  std::unique_ptr<StepTracer> tracer_;
  bool finalized_ = false;
  bool checkpoint_file_written_ = false;
  std::function<absl::Status(int peer, Message message)> snapshot_sink_;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_STAGE_H_
