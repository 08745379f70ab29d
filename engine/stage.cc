// Stage: construction, parameters and the task's lifecycle events.
#include "engine/stage.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/packed_gemm.h"

namespace trainyard {

Stage::~Stage() = default;

std::string Stage::Where() const { return absl::StrCat("stage ", index_); }

absl::Status Stage::CheckTrains(const char* what) const {
  if (plan_.trains()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(Where(), ": ", what, " is for training jobs; this job's ",
                   "kind is ", Quote(plan_.spec.kind())));
}

absl::StatusOr<std::unique_ptr<Stage>> Stage::Create(
    const JobPlan& plan, int index, Transport* transport,
    const StageOptions& options, StageData data) {
  std::unique_ptr<Stage> st(new Stage());
  st->plan_ = plan;
  st->index_ = index;
  st->num_stages_ = plan.num_stages();
  st->transport_ = transport;
  st->options_ = options;
  st->data_ = std::move(data);
  if (index < 0 || index >= st->num_stages_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage index ", index, " out of range [0, ", st->num_stages_, ")"));
  }
  if (st->num_stages_ > 1 &&
      (transport == nullptr || transport->world_size() != st->num_stages_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        st->Where(), ": needs a transport with ", st->num_stages_, " ranks"));
  }
  RETURN_IF_ERROR(st->SetUpDevice());
  RETURN_IF_ERROR(st->CreateBlocks());
  RETURN_IF_ERROR(st->CreateParamStore());
  if (plan.trains()) {
    ASSIGN_OR_RETURN(
        StageOptimizer opt,
        StageOptimizer::Create(plan.spec.optimizer(), st->store_->segments(),
                               st->store_->total(), st->ctx_));
    st->optimizer_.emplace(std::move(opt));
  }
  RETURN_IF_ERROR(st->SetUpReplicas());
  if (plan.trains()) RETURN_IF_ERROR(st->SetUpSchedule());
  RETURN_IF_ERROR(st->SetUpTask());
  RETURN_IF_ERROR(st->SetUpData());
  return st;
}

absl::Status Stage::SetUpDevice() {
  ctx_ = options_.exec;
  if (ctx_ == nullptr) {
    ASSIGN_OR_RETURN(own_ctx_,
                     ExecContext::Create(Device::Cpu(), Precision::kFp32));
    ctx_ = own_ctx_.get();
  }
  RETURN_IF_ERROR(ctx_->Activate());
  tracer_ = std::make_unique<StepTracer>(ctx_);
  return absl::OkStatus();
}

absl::Status Stage::CreateBlocks() {
  for (int c = 0; c < plan_.num_chunks; ++c) {
    Chunk chunk;
    chunk.virtual_stage = plan_.VirtualStage(index_, c);
    const auto [first, end] = plan_.ChunkBlocks(index_, c);
    chunk.first_block = first;
    chunk.local_begin = static_cast<int>(blocks_.size());
    for (int b = first; b < end; ++b) {
      absl::StatusOr<std::unique_ptr<BlockKernel>> k =
          CreateBlockKernel(plan_.blocks[b], ctx_);
      if (!k.ok()) {
        return Prefixed(k.status(), absl::StrCat(Where(), " block ", b, " on ",
                                                 ctx_->ToString(), ": "));
      }
      blocks_.push_back(*std::move(k));
    }
    chunk.local_end = static_cast<int>(blocks_.size());
    chunks_.push_back(std::move(chunk));
  }
  return absl::OkStatus();
}

absl::Status Stage::CreateParamStore() {
  {
    absl::StatusOr<ParamStore> store = ParamStore::Create(plan_, index_, ctx_);
    if (!store.ok()) {
      return Prefixed(store.status(), absl::StrCat(Where(), ": "));
    }
    store_.emplace(*std::move(store));
  }
  grads_written_.assign(blocks_.size(), false);
  // Each chunk's parameters are one run of the flat buffers (the store lays
  // the stage's blocks out chunk after chunk).
  const std::vector<ParamSegment>& segments = store_->segments();
  for (size_t i = 0, c = 0; i < segments.size(); ++i) {
    const int block = plan_.params[store_->global_index(i)].block;
    while (block >= plan_.ChunkBlocks(index_, c).second) ++c;
    Chunk& chunk = chunks_[c];
    if (chunk.grad_size == 0) chunk.grad_offset = segments[i].offset;
    chunk.grad_size += segments[i].size();
  }
  // parallelism.accumulation (docs/ACCUMULATION.md): a tree per chunk,
  // unless one microbatch per replica makes it that microbatch's gradient.
  tree_accumulation_ =
      plan_.trains() && plan_.spec.parallelism().accumulation() == "tree";
  if (KeepsGradientTree(plan_.spec)) {
    for (Chunk& chunk : chunks_) chunk.tree.emplace(ctx_, chunk.grad_size);
  }
  chain_weight_passes_ =
      ChainsWeightPasses(plan_) && UsePackedGemm(LargestMicrobatch(plan_.spec));
  return absl::OkStatus();
}

absl::Status Stage::SetUpReplicas() {
  replicas_ = std::max(1, plan_.spec.parallelism().replicas());
  replica_ = options_.replica;
  replica_group_ = options_.replica_group;
  // A forward-only job's replicas work alone, on rows of their own.
  if (replicas_ > 1 && plan_.trains() &&
      (replica_group_ == nullptr || replica_group_->size() != replicas_ ||
       replica_group_->rank() != replica_ || !tree_accumulation_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), ": a job with ", replicas_,
        " replicas needs each stage's replica group (of that size, with this "
        "stage's replica as its rank) and accumulation \"tree\""));
  }
  return absl::OkStatus();
}

absl::Status Stage::SetUpSchedule() {
  const auto& parallelism = plan_.spec.parallelism();
  // Each replica runs its share of the microbatches through the schedule.
  const int per_replica = MicrobatchesPerReplica(plan_.spec);
  if (options_.schedule.has_value()) {
    const Schedule& given = *options_.schedule;
    if (given.num_stages != num_stages_ ||
        given.num_microbatches != per_replica ||
        given.num_chunks != plan_.num_chunks ||
        (plan_.num_chunks > 1 && given.layout != plan_.chunk_layout) ||
        !given.training) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(), ": schedule ", Quote(given.name), " is for ",
          given.num_stages, " stages, ", given.num_microbatches,
          " microbatches and ", given.num_chunks, " chunks (training: ",
          given.training ? "yes" : "no", "); this job runs ", num_stages_, ", ",
          per_replica, " and ", plan_.num_chunks));
    }
    train_schedule_ = given;
  } else {
    ASSIGN_OR_RETURN(train_schedule_,
                     MakeTrainingSchedule(parallelism.schedule(), num_stages_,
                                          per_replica, plan_.num_chunks));
  }
  return ValidateSchedule(train_schedule_);
}

bool Stage::PluginLossOnDevice() const {
  return task_ != nullptr && task_->plugin().has_device_loss() &&
         !options_.host_loss;
}

bool Stage::InputsPassThroughOnDevice() const {
  return scalars_.has_value() && PluginLossOnDevice() &&
         task_->plugin().passes_inputs_through();
}

absl::Status Stage::SetUpTask() {
  const auto& spec = plan_.spec;
  if (is_first() || is_last()) {
    ASSIGN_OR_RETURN(
        std::shared_ptr<const TaskPlugin> plugin,
        TaskPlugin::Load(options_.plugin_dir, spec.task().plugin()));
    ASSIGN_OR_RETURN(const std::string config, TaskConfigJson(spec));
    ASSIGN_OR_RETURN(task_, Task::Create(plugin, config, options_.data_dir));
    // Refused before the job's output folder is made or a row read.
    if (plan_.kind == JobKind::kInfer && is_last() &&
        !plugin->has_infer_outputs()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "task.plugin: plugin \"", spec.task().plugin(),
          "\" cannot run inference jobs: it has no infer_outputs (task ABI "
          "v1, docs/PLUGIN_ABI.md)"));
    }
  }
  // A device stage keeps the step's small numbers on the device; with a
  // plugin that has a device loss, the last stage's loss runs there too.
  const bool device_loss = PluginLossOnDevice();
  if (!ctx_->device().is_cpu()) {
    const int slots =
        is_last() && device_loss
            ? static_cast<int>(task_->plugin().device_table().num_slots)
            : 0;
    ASSIGN_OR_RETURN(
        StepScalars scalars,
        StepScalars::Create(ctx_, static_cast<int>(store_->segments().size()),
                            spec.parallelism().microbatches(), slots));
    scalars_.emplace(std::move(scalars));
  }
  if (is_last()) {
    const bool on_device = scalars_.has_value() && device_loss;
    loss_.emplace(task_.get(), ctx_, on_device ? &*scalars_ : nullptr);
    device_totals_ =
        plan_.trains() && on_device && num_stages_ == 1 && replicas_ == 1;
  }
  return absl::OkStatus();
}

absl::Status Stage::SetUpData() {
  if (!is_first()) return absl::OkStatus();
  // A forward-only job reads its rows (data_.eval) in order.
  const Dataset* needed = plan_.trains() ? data_.train.get() : data_.eval.get();
  if (needed == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": first stage needs the ",
                     plan_.trains() ? "train data" : "job's rows"));
  }
  const auto& data = plan_.spec.data();
  if (plan_.trains()) {
    sampler_ = std::make_unique<BatchSampler>(data_.train->num_rows(),
                                              data.batch_size(), data.shuffle(),
                                              data.seed());
  }
  if (InputsPassThroughOnDevice()) {
    RETURN_IF_ERROR(UploadData(options_.device_data_bytes));
  }
  if (plan_.trains() && !data_.train->in_memory()) {
    RETURN_IF_ERROR(StartReader());
  }
  return absl::OkStatus();
}

absl::Status Stage::StartReader() {
  const auto& data = plan_.spec.data();
  const int M = plan_.spec.parallelism().microbatches();
  const int mine = M / replicas_;
  // This replica's microbatches [replica_ * mine, (replica_ + 1) * mine),
  // as PrepareBatch cuts them.
  const auto ranges = MicrobatchRanges(data.batch_size(), M);
  BatchReader::Options options;
  options.batch_size = data.batch_size();
  options.shuffle = data.shuffle();
  options.seed = data.seed();
  options.slice_begin = ranges[replica_ * mine].first;
  options.slice_end = ranges[(replica_ + 1) * mine - 1].second;
  options.depth = kReadAheadBatches;
  // Half-width features cross to the device as they are stored.
  options.stored_width = InputsPassThroughOnDevice();
  const ExecContext* ctx = ctx_;
  options.allocate = [ctx](DType dtype, Shape shape) {
    return ctx->PinnedEmpty(dtype, std::move(shape));
  };
  ASSIGN_OR_RETURN(
      reader_, BatchReader::Create(data_.train->shards, std::move(options)));
  return absl::OkStatus();
}

absl::Status Stage::UploadData(int64_t limit) {
  const Dataset* sets[] = {data_.train.get(), data_.eval.get()};
  int64_t bytes = 0;
  for (const Dataset* d : sets) {
    if (d == nullptr) continue;
    // A sharded source streams from its files: rows gathered on the host.
    if (!d->in_memory()) return absl::OkStatus();
    bytes += static_cast<int64_t>(d->features.nbytes() + d->targets.nbytes());
  }
  if (limit < 0) {
    ASSIGN_OR_RETURN(const int64_t free, ctx_->FreeMemoryBytes());
    limit = free / 4;
  }
  if (bytes > limit) return absl::OkStatus();  // rows gathered on the host
  DeviceData d;
  if (data_.train != nullptr) {
    ASSIGN_OR_RETURN(d.train_features, ctx_->ToDevice(data_.train->features));
    ASSIGN_OR_RETURN(d.train_targets, ctx_->ToDevice(data_.train->targets));
  }
  if (data_.eval != nullptr) {
    ASSIGN_OR_RETURN(d.eval_features, ctx_->ToDevice(data_.eval->features));
    ASSIGN_OR_RETURN(d.eval_targets, ctx_->ToDevice(data_.eval->targets));
  }
  const int64_t batch = plan_.spec.data().batch_size();
  ASSIGN_OR_RETURN(d.rows_host, ctx_->PinnedEmpty(DType::kInt64, {batch}));
  ASSIGN_OR_RETURN(d.rows, ctx_->Empty(DType::kInt64, {batch}));
  device_data_.emplace(std::move(d));
  return absl::OkStatus();
}

NamedTensors Stage::NamedParameters() const { return store_->Named(); }

absl::StatusOr<NamedTensors> Stage::NamedParametersOnHost() const {
  return store_->NamedOnHost();
}

absl::Status Stage::InitParameters() { return store_->Init(plan_); }

absl::Status Stage::NotifyTask(TrainyardEventKind kind,
                               const std::string& detail) {
  return NotifyTask(kind, detail, completed_steps_);
}

absl::Status Stage::NotifyTask(TrainyardEventKind kind,
                               const std::string& detail, int64_t step) {
  if (task_ == nullptr) return absl::OkStatus();
  return task_->OnEvent(kind, step, detail);
}

absl::Status Stage::Finalize() {
  if (task_ == nullptr || finalized_) return absl::OkStatus();
  finalized_ = true;
  return task_->Finalize();
}

}  // namespace trainyard
