// Job spec loading, validation and planning.
//
// ParseJobSpecJson / LoadJobSpecFile turn proto3 JSON into a JobSpec (unknown
// fields are errors). PlanJob validates a JobSpec completely before anything
// is allocated, fills in every default, resolves block widths, the pipeline
// split and the per-parameter weight-decay mask, and estimates the job's
// memory. docs/SPEC.md is the user-facing reference for all of it.
//
// PlanJob (job_plan.cc) runs one step per part of the spec, each in a file
// of its own: spec_limits, data_check, model_check, parallelism_check,
// training_check, placement (with BalancedSplit and GlobMatch) and
// memory_estimate. The steps collect problems in a Problems list
// (problems.h, with Quote) and resolve paths with spec_paths.h; the JSON
// functions are in spec_json.cc.
//
// All functions are pure apart from reading files (the spec file, and .npy
// headers / safetensors existence when PlanOptions::check_files) and asking
// the OS for physical memory; they are thread-safe. A JobPlan is a plain
// value that owns its data.
#ifndef TRAINYARD_PLAN_JOB_PLAN_H_
#define TRAINYARD_PLAN_JOB_PLAN_H_

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/block_config.h"
#include "core/tensor.h"
#include "proto/job_spec.pb.h"
#include "schedule/schedule.h"

namespace trainyard {

// Parses proto3 JSON (lowerCamelCase or proto field names). Errors are
// InvalidArgument naming `source_name` and what protobuf reported, e.g.
//   jobs/a.json: invalid job spec JSON: model.blocks[0]: Cannot find field.
// Unknown fields are errors so a typo cannot be silently ignored.
absl::StatusOr<trainyard::v1::JobSpec> ParseJobSpecJson(
    const std::string& json_text, const std::string& source_name);

// Reads `path` and parses it with ParseJobSpecJson. NotFound / Internal if
// the file cannot be read, naming the path.
absl::StatusOr<trainyard::v1::JobSpec> LoadJobSpecFile(const std::string& path);

// `spec` as proto3 JSON with the proto's field names, on one line, as
// checkpoint and output manifests record it; "null" if it cannot be
// printed.
std::string SpecToJson(const trainyard::v1::JobSpec& spec);

// Size limits on a spec, checked before anything else (docs/SPEC.md,
// "Limits"): a spec over one is not looked at further.
inline constexpr size_t kMaxSpecBytes = size_t{1} << 20;  // serialized
inline constexpr int kMaxBlocks = 1024;
inline constexpr size_t kMaxNameBytes = 256;
inline constexpr size_t kMaxPathBytes = 4096;
inline constexpr int kMaxListEntries = 256;  // no_decay, split
inline constexpr size_t kMaxTaskConfigBytes = size_t{64} << 10;
inline constexpr int kMaxTaskConfigDepth = 16;
inline constexpr int kMaxReplicas = 64;
// Block widths and synthetic feature / output counts: wider is surely a
// typo, and the cap keeps shape products (out * in, rows * cols) far from
// int64 overflow.
inline constexpr int64_t kMaxWidth = int64_t{1} << 24;
// stages x chunks x microbatches per replica: every worker builds the whole
// schedule (about 7 actions per chunk pass).
inline constexpr int64_t kMaxScheduledPasses = int64_t{1} << 20;
// Longest prefix of a value an error message quotes.
inline constexpr size_t kMaxQuotedBytes = 64;

// A value as an error message shows it: "value", or its first
// kMaxQuotedBytes bytes C-escaped and its size when longer, so an error
// never carries a long value back to the caller.
std::string Quote(const std::string& s);

// JobSpec.recovery defaults and limits (docs/SPEC.md).
inline constexpr int kDefaultMaxRestarts = 3;
inline constexpr int kMaxRestartsLimit = 1000;
inline constexpr int64_t kDefaultRestartBackoffMs = 1000;
inline constexpr int64_t kMaxRestartBackoffMs = 30000;

struct PlanOptions {
  // Relative paths in the spec (data files, init safetensors, checkpoint
  // dir) resolve against this folder; empty = the current directory. The
  // spec file's folder is the usual choice.
  std::string base_dir;
  // Memory the job may use; 0 = this machine's physical memory (sysconf).
  uint64_t memory_limit_bytes = 0;
  // Read .npy headers and check that input files exist. Off only for tools
  // that plan a spec for another machine.
  bool check_files = true;
  // When set (the worker's --data_dir), every path in the spec (data files,
  // init safetensors, checkpoint dir) must resolve inside this folder,
  // symlinks included; one that does not is a problem naming its field.
  std::string confine_to;
  // How the problem names the folder's origin.
  std::string confine_flag = "this worker's --data_dir";

  // For a process that runs no stage (the controller, a client): the job's
  // shape only, checking no file and no memory (the workers check those
  // against their own machines).
  static PlanOptions ShapeOnly() {
    PlanOptions options;
    options.check_files = false;
    options.memory_limit_bytes = std::numeric_limits<uint64_t>::max();
    return options;
  }
};

// Bytes the job is estimated to need; formulas in docs/SPEC.md ("Memory").
struct MemoryEstimate {
  uint64_t params = 0;
  uint64_t grads = 0;
  uint64_t optimizer_state = 0;
  // Copies of the state (params and optimizer state) held outside the
  // step: one for a checkpoint being written in the background, four for
  // in-memory snapshots (two steps, own and a neighbour's copy).
  uint64_t state_copies = 0;
  uint64_t activations = 0;
  // CPU and simulated-device jobs with microbatches of at most 256 rows
  // (kPackedGemmMaxRows): fc1's and fc2's weights packed once each (as W^T)
  // for the packed GEMM (kernels/packed_gemm.h), counted whether or not the
  // worker's CPU uses it (without AVX-512 it does up to 128 rows only).
  uint64_t packed_weights = 0;
  uint64_t data = 0;
  uint64_t total = 0;
  // "12.0 GiB (params 3.0 GiB, grads 3.0 GiB, optimizer state 6.0 GiB,
  // activations 10.0 MiB, data 2.0 KiB)"
  std::string description;
};

// What a job does (JobSpec.kind): train, or run the model forward over a
// data set once, writing the task's outputs (infer) or reporting its loss
// and metrics (eval).
enum class JobKind { kTrain, kInfer, kEval };

// inference.shard_rows when unset.
inline constexpr int64_t kDefaultShardRows = 65536;
// data.memory_limit_mib when unset.
inline constexpr int64_t kDefaultDataMemoryLimitMib = 512;
// Batches the first stage reads ahead of the step over a sharded source
// (engine/batch_reader.h); it holds one more, the batch in use.
inline constexpr int kReadAheadBatches = 2;

// The processes of a job: S stages x R replicas, one rank each, stage s of
// replica r being rank r * S + s.
struct Gang {
  int stages = 1;
  int replicas = 1;

  int size() const { return stages * replicas; }
  int RankOf(int replica, int stage) const { return replica * stages + stage; }
  int StageOf(int rank) const { return rank % stages; }
  int ReplicaOf(int rank) const { return rank / stages; }
};

struct JobPlan {
  // The spec with every default filled in (see docs/SPEC.md), in_features
  // resolved, seeds resolved and paths absolute.
  trainyard::v1::JobSpec spec;
  JobKind kind = JobKind::kTrain;  // spec.kind
  // A training job: optimizer steps, checkpoints. The others run forward
  // only, over their rows once (no gradients, no optimizer state).
  bool trains() const { return kind == JobKind::kTrain; }
  // One config per block, global order.
  std::vector<MlpBlockConfig> blocks;
  // Model chunks per stage v (parallelism.chunks) and which virtual stage
  // each chunk holds (schedule/schedule.h); 1 and kLoop (virtual stage = stage)
  // for the schedules without chunks.
  int num_chunks = 1;
  ChunkLayout chunk_layout = ChunkLayout::kLoop;
  // Virtual stage k holds blocks [virtual_stage_begin[k],
  // virtual_stage_begin[k + 1]); S v + 1 entries, the first 0, the last
  // blocks.size().
  std::vector<int> virtual_stage_begin;

  struct ParamSpec {
    std::string name;  // "blocks.3.fc1.weight" (global block index)
    Shape shape;
    int block = 0;
    int stage = 0;       // the stage holding the block (in one of its chunks)
    bool decay = false;  // weight decay applies (optimizer.decay_mask)
  };
  // Every parameter, block by block, each block in BlockParamInfos order.
  std::vector<ParamSpec> params;

  int64_t feature_dim = 0;  // D: width of the features and of block 0's input
  int64_t output_dim = 0;   // the last block's out_features
  // True when targets are class ids (int32/int64 [N]); false for float
  // regression targets [N, K].
  bool class_targets = false;
  int64_t train_rows = 0;  // N of the train source (before eval_fraction)

  MemoryEstimate memory;

  int num_virtual_stages() const {
    return static_cast<int>(virtual_stage_begin.size()) - 1;
  }
  int num_stages() const { return num_virtual_stages() / num_chunks; }
  // The virtual stage chunk `chunk` of stage `stage` holds.
  int VirtualStage(int stage, int chunk) const {
    return VirtualStageOf(chunk_layout, num_stages(), num_chunks, stage, chunk);
  }
  // parallelism.replicas (at least 1).
  int num_replicas() const {
    return spec.parallelism().replicas() > 1 ? spec.parallelism().replicas()
                                             : 1;
  }
  Gang gang() const { return Gang{num_stages(), num_replicas()}; }
  // The (stage, chunk) holding virtual stage `virtual_stage`.
  StageChunk HolderOf(int virtual_stage) const {
    return StageChunkOf(chunk_layout, num_stages(), num_chunks, virtual_stage);
  }
  // The stage holding the last virtual stage: it computes the loss and the
  // task's metrics (S - 1; 0 under "zbv").
  int loss_stage() const { return HolderOf(num_virtual_stages() - 1).stage; }
  // Blocks [first, second) of chunk `chunk` of stage `stage`.
  std::pair<int, int> ChunkBlocks(int stage, int chunk) const {
    const int k = VirtualStage(stage, chunk);
    return {virtual_stage_begin[k], virtual_stage_begin[k + 1]};
  }
};

// Validates `spec` and plans it. On any problem returns InvalidArgument whose
// message lists EVERY problem found, one per line, each starting with its
// proto field path, e.g.
//   model.blocks[2].ffn_hidden_size: must be > 0, got -4
//   parallelism.schedule: must be one of "gpipe", "1f1b", got "zb"
// A spec that is valid but whose memory estimate exceeds the limit is
// rejected with ResourceExhausted, naming the estimate and the limit.
absl::StatusOr<JobPlan> PlanJob(const trainyard::v1::JobSpec& spec,
                                const PlanOptions& options);

// Whether a training job's stage runs its weight-gradient passes at the
// end of each step, all its microbatches chained into one accumulation per
// weight (kernels/mlp_block.h, BackwardWeights), instead of where the
// schedule puts them: a CPU job of one stage and one chunk with
// accumulation "sequential" and at least two microbatches of at most
// kPackedGemmMaxRows rows, whose weight gradients the packed GEMM computes
// with the same bits either way. The stage then holds every microbatch's
// saved tensors until the step's end (the memory estimate counts them).
// The stage chains only where its CPU runs these microbatches on the
// packed GEMM (UsePackedGemm: on, and up to 128 rows without AVX-512); the
// estimate counts it on every CPU.
bool ChainsWeightPasses(const JobPlan& plan);

// The microbatches one pipeline (replica) runs a step: m = M / R.
int MicrobatchesPerReplica(const v1::JobSpec& spec);

// Rows of the largest microbatch: b = ceil(batch_size / M).
int64_t LargestMicrobatch(const v1::JobSpec& spec);

// Whether a training stage sums its microbatches' weight gradients in a
// GradientTree (engine/gradient_tree.h): accumulation "tree" and m >= 2.
// With one microbatch per replica the tree of one gradient is that
// gradient, written straight into the stage's gradient buffer by the same
// GEMM call, so the stage keeps no tree and the estimate counts none.
bool KeepsGradientTree(const v1::JobSpec& spec);

// task.config as the JSON text a plugin's create() / validate_config()
// takes ("{}" when unset). InvalidArgument naming task.config when the
// Struct cannot be written as JSON.
absl::StatusOr<std::string> TaskConfigJson(const trainyard::v1::JobSpec& spec);

// Contiguous split of blocks with these parameter counts into `stages`
// non-empty stages (1 <= stages <= size) minimising the largest stage's
// count; among optimal splits, the one whose vector of stage sizes is
// lexicographically smallest (earlier stages take fewer blocks: under 1F1B
// they hold the most microbatches in flight). Returns blocks per stage.
std::vector<int> BalancedSplit(const std::vector<int64_t>& block_params,
                               int stages);

// Glob match over parameter names: '*' matches any run of characters
// (including '.' and the empty run); every other character matches itself.
bool GlobMatch(const std::string& pattern, const std::string& name);

}  // namespace trainyard

#endif  // TRAINYARD_PLAN_JOB_PLAN_H_
