#include "engine/stage.h"

#include <chrono>
#include <cstring>
#include <map>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/lr_schedule.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "kernels/device_ops.h"
#include "engine/checkpoint_store.h"
#include "engine/step_reducer.h"

namespace trainyard {

// One microbatch in flight on this stage.
struct Stage::Microbatch {
  int chunk = 0;
  int index = 0;
  Tensor input;        // [b, in] this stage's input
  NamedTensors state;  // task state (host), travels with the microbatch
  Tensor output;       // [b, out] this stage's output
  Tensor grad_output;  // [b, out] dLoss/dOutput (scaled)
  Tensor grad_input;   // [b, in]  to send back
  std::vector<std::unique_ptr<BlockSaved>> saved;  // per block of the chunk
};

namespace {

using Clock = std::chrono::steady_clock;

int64_t Micros(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

void AddSpan(StepTrace* trace, const Span& span) {
  if (trace->spans.size() >= kMaxSpansPerStep) {
    trace->truncated = true;
    return;
  }
  trace->spans.push_back(span);
}

// Splits `rows` rows into `parts` contiguous microbatches whose sizes differ
// by at most one (the first rows % parts get one more).
std::vector<std::pair<int64_t, int64_t>> SplitRows(int64_t rows, int parts) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t base = rows / parts, extra = rows % parts;
  int64_t begin = 0;
  for (int i = 0; i < parts; ++i) {
    const int64_t n = base + (i < extra ? 1 : 0);
    out.push_back({begin, begin + n});
    begin += n;
  }
  return out;
}

const char* TaskStateKey(bool first_only) {
  return first_only ? "task.first_stage.state" : "task.last_stage.state";
}

}  // namespace

// Times one part of a step on the stage's StreamTimer: a mark before and
// one after, resolved later into `phase` of the step's StageTimes (may be
// null) and, when `traced`, a span of the step's trace. A no-op outside
// RunStep (evals are timed as one host-clock span).
class Stage::SpanTimer {
 public:
  SpanTimer(Stage* stage, double StageTimes::*phase, SpanKind kind,
            int microbatch = -1, bool traced = true)
      : stage_(stage), span_{stage->timer_, kind,  microbatch, -1, -1,
                             phase,         traced} {
    if (stage_->timing_) span_.start = stage_->TimingMark();
  }
  ~SpanTimer() {
    if (!stage_->timing_ || span_.start < 0) return;
    span_.end = stage_->TimingMark();
    if (span_.end >= 0) stage_->pending_.push_back(span_);
  }
  SpanTimer(const SpanTimer&) = delete;
  SpanTimer& operator=(const SpanTimer&) = delete;

 private:
  Stage* const stage_;
  PendingSpan span_;
};

int Stage::TimingMark() {
  absl::StatusOr<int> id = timers_[timer_]->Mark();
  if (!id.ok()) {
    if (timing_error_.ok()) timing_error_ = id.status();
    return -1;
  }
  return *id;
}

absl::Status Stage::ResolveSpans(int upto, StepReport* report) {
  RETURN_IF_ERROR(std::exchange(timing_error_, absl::OkStatus()));
  auto micros = [this](int timer, int id) {
    return timers_[timer]->Micros(id);
  };
  // The previous step's spans queued after its read: complete now, counted
  // in this step's phases (they are not in any trace).
  for (const PendingSpan& p : carried_) {
    ASSIGN_OR_RETURN(const int64_t start, micros(p.timer, p.start));
    ASSIGN_OR_RETURN(const int64_t end, micros(p.timer, p.end));
    if (p.phase != nullptr) report->times.*p.phase += (end - start) * 1e-6;
  }
  carried_.clear();
  for (const PendingSpan& p : pending_) {
    if (upto >= 0 && p.end > upto) {
      carried_.push_back(p);
      continue;
    }
    ASSIGN_OR_RETURN(const int64_t start, micros(p.timer, p.start));
    ASSIGN_OR_RETURN(const int64_t end, micros(p.timer, p.end));
    if (p.phase != nullptr) report->times.*p.phase += (end - start) * 1e-6;
    if (p.traced) AddSpan(&report->trace, {p.kind, p.microbatch, start, end});
  }
  pending_.clear();
  return absl::OkStatus();
}

Stage::~Stage() = default;

std::string Stage::Where() const { return absl::StrCat("stage ", index_); }

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
  st->ctx_ = options.exec;
  if (st->ctx_ == nullptr) {
    ASSIGN_OR_RETURN(st->own_ctx_,
                     ExecContext::Create(Device::Cpu(), Precision::kFp32));
    st->ctx_ = st->own_ctx_.get();
  }
  RETURN_IF_ERROR(st->ctx_->Activate());
  for (auto& timer : st->timers_) {
    timer = std::make_unique<StreamTimer>(st->ctx_);
  }
  const auto& spec = plan.spec;
  for (int c = 0; c < plan.num_chunks; ++c) {
    Chunk chunk;
    chunk.virtual_stage = plan.VirtualStage(index, c);
    const auto [first, end] = plan.ChunkBlocks(index, c);
    chunk.first_block = first;
    chunk.local_begin = static_cast<int>(st->blocks_.size());
    for (int b = first; b < end; ++b) {
      absl::StatusOr<std::unique_ptr<BlockKernel>> k =
          CreateBlockKernel(plan.blocks[b], st->ctx_);
      if (!k.ok()) {
        return Prefixed(k.status(),
                        absl::StrCat(st->Where(), " block ", b, " on ",
                                     st->ctx_->ToString(), ": "));
      }
      st->blocks_.push_back(*std::move(k));
    }
    chunk.local_end = static_cast<int>(st->blocks_.size());
    st->chunks_.push_back(std::move(chunk));
  }
  {
    absl::StatusOr<ParamStore> store =
        ParamStore::Create(plan, index, st->ctx_);
    if (!store.ok()) {
      return Prefixed(store.status(), absl::StrCat(st->Where(), ": "));
    }
    st->store_.emplace(*std::move(store));
  }
  st->grads_written_.assign(st->blocks_.size(), false);
  // Each chunk's parameters are one run of the flat buffers (the store lays
  // the stage's blocks out chunk after chunk).
  const std::vector<ParamSegment>& segments = st->store_->segments();
  for (size_t i = 0, c = 0; i < segments.size(); ++i) {
    const int block = plan.params[st->store_->global_index(i)].block;
    while (block >= plan.ChunkBlocks(index, c).second) ++c;
    Chunk& chunk = st->chunks_[c];
    if (chunk.grad_size == 0) chunk.grad_offset = segments[i].offset;
    chunk.grad_size += segments[i].size();
  }
  // parallelism.accumulation (docs/ACCUMULATION.md): a tree per chunk.
  st->tree_accumulation_ = spec.parallelism().accumulation() == "tree";
  if (st->tree_accumulation_) {
    for (Chunk& chunk : st->chunks_) {
      chunk.tree.emplace(st->ctx_, chunk.grad_size);
    }
  }

  ASSIGN_OR_RETURN(
      StageOptimizer opt,
      StageOptimizer::Create(spec.optimizer(), st->store_->segments(),
                             st->store_->total(), st->ctx_));
  st->optimizer_.emplace(std::move(opt));

  st->replicas_ = std::max(1, spec.parallelism().replicas());
  st->replica_ = options.replica;
  st->replica_group_ = options.replica_group;
  if (st->replicas_ > 1 && (options.replica_group == nullptr ||
                            options.replica_group->size() != st->replicas_ ||
                            options.replica_group->rank() != options.replica ||
                            !st->tree_accumulation_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        st->Where(), ": a job with ", st->replicas_,
        " replicas needs each stage's replica group (of that size, with this "
        "stage's replica as its rank) and accumulation \"tree\""));
  }
  // Each replica runs its share of the microbatches through the schedule.
  const int per_replica = spec.parallelism().microbatches() / st->replicas_;
  if (options.schedule.has_value()) {
    const Schedule& given = *options.schedule;
    if (given.num_stages != st->num_stages_ ||
        given.num_microbatches != per_replica ||
        given.num_chunks != plan.num_chunks ||
        (plan.num_chunks > 1 && given.layout != plan.chunk_layout) ||
        !given.training) {
      return absl::InvalidArgumentError(absl::StrCat(
          st->Where(), ": schedule ", Quote(given.name), " is for ",
          given.num_stages, " stages, ", given.num_microbatches,
          " microbatches and ", given.num_chunks, " chunks (training: ",
          given.training ? "yes" : "no", "); this job runs ", st->num_stages_,
          ", ", per_replica, " and ", plan.num_chunks));
    }
    st->train_schedule_ = given;
  } else {
    ASSIGN_OR_RETURN(
        st->train_schedule_,
        MakeTrainingSchedule(spec.parallelism().schedule(), st->num_stages_,
                             per_replica, plan.num_chunks));
  }
  RETURN_IF_ERROR(ValidateSchedule(st->train_schedule_));

  if (st->is_first() || st->is_last()) {
    ASSIGN_OR_RETURN(
        std::shared_ptr<const TaskPlugin> plugin,
        TaskPlugin::Load(options.plugin_dir, spec.task().plugin()));
    ASSIGN_OR_RETURN(const std::string config, TaskConfigJson(spec));
    ASSIGN_OR_RETURN(st->task_, Task::Create(plugin, config, options.data_dir));
  }
  // A device stage keeps the step's small numbers on the device; with a
  // plugin that has a device loss, the last stage's loss runs there too.
  const bool device_loss = st->task_ != nullptr &&
                           st->task_->plugin().has_device_loss() &&
                           !options.host_loss;
  if (!st->ctx_->device().is_cpu()) {
    const int slots =
        st->is_last() && device_loss
            ? static_cast<int>(st->task_->plugin().device_table().num_slots)
            : 0;
    ASSIGN_OR_RETURN(
        StepScalars scalars,
        StepScalars::Create(st->ctx_, static_cast<int>(segments.size()),
                            spec.parallelism().microbatches(), slots));
    st->scalars_.emplace(std::move(scalars));
  }
  if (st->is_last()) {
    const bool on_device = st->scalars_.has_value() && device_loss;
    st->loss_.emplace(st->task_.get(), st->ctx_,
                      on_device ? &*st->scalars_ : nullptr);
    st->device_totals_ =
        on_device && st->num_stages_ == 1 && st->replicas_ == 1;
  }
  if (st->is_first()) {
    if (st->data_.train == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(st->Where(), ": first stage needs the train data"));
    }
    st->sampler_ = std::make_unique<BatchSampler>(
        st->data_.train->features.dim(0), spec.data().batch_size(),
        spec.data().shuffle(), spec.data().seed());
    if (st->scalars_.has_value() && device_loss &&
        st->task_->plugin().passes_inputs_through()) {
      RETURN_IF_ERROR(st->UploadData(options.device_data_bytes));
    }
  }
  return st;
}

NamedTensors Stage::NamedParameters() const { return store_->Named(); }

absl::StatusOr<NamedTensors> Stage::NamedParametersOnHost() const {
  return store_->NamedOnHost();
}

absl::Status Stage::InitParameters() { return store_->Init(plan_); }

absl::Status Stage::UploadData(int64_t limit) {
  const Dataset* sets[] = {data_.train.get(), data_.eval.get()};
  int64_t bytes = 0;
  for (const Dataset* d : sets) {
    if (d == nullptr) continue;
    bytes += static_cast<int64_t>(d->features.nbytes() + d->targets.nbytes());
  }
  if (limit < 0) {
    ASSIGN_OR_RETURN(const int64_t free, ctx_->FreeMemoryBytes());
    limit = free / 4;
  }
  if (bytes > limit) return absl::OkStatus();  // rows gathered on the host
  DeviceData d;
  ASSIGN_OR_RETURN(d.train_features, ctx_->ToDevice(data_.train->features));
  ASSIGN_OR_RETURN(d.train_targets, ctx_->ToDevice(data_.train->targets));
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

absl::Status Stage::PrepareBatch(const Dataset& data, std::vector<int64_t> rows,
                                 int64_t step, bool is_eval,
                                 int num_microbatches, int first, int count) {
  // The whole batch's split into microbatches; this replica takes `count`
  // of them from `first`, so every microbatch holds the same rows whatever
  // the number of replicas.
  const auto ranges =
      SplitRows(static_cast<int64_t>(rows.size()), num_microbatches);
  const int64_t begin = ranges[first].first;
  const int64_t end = ranges[first + count - 1].second;
  rows = std::vector<int64_t>(rows.begin() + begin, rows.begin() + end);
  Tensor inputs;
  NamedTensors state;
  if (device_data_.has_value()) {
    // The rows are gathered on the device from the resident data set; only
    // their indices cross (asynchronously, from pinned memory, which the
    // step's synchronisation frees for the next batch).
    const Tensor& features =
        is_eval ? device_data_->eval_features : device_data_->train_features;
    const Tensor& targets =
        is_eval ? device_data_->eval_targets : device_data_->train_targets;
    const int64_t n = static_cast<int64_t>(rows.size());
    Tensor host_rows = device_data_->rows_host.Rows(0, n);
    Tensor dev_rows = device_data_->rows.Rows(0, n);
    if (n > 0) {
      std::memcpy(host_rows.raw_data(), rows.data(), n * sizeof(int64_t));
    }
    RETURN_IF_ERROR(ctx_->CopyToDeviceAsync(host_rows, &dev_rows));
    ASSIGN_OR_RETURN(
        inputs, ctx_->Empty(ctx_->activation_dtype(), {n, features.dim(1)}));
    RETURN_IF_ERROR(GatherRows(*ctx_, features, dev_rows, &inputs));
    Shape target_shape = targets.shape();
    target_shape[0] = n;
    ASSIGN_OR_RETURN(Tensor gathered,
                     ctx_->Empty(targets.dtype(), target_shape));
    RETURN_IF_ERROR(GatherRows(*ctx_, targets, dev_rows, &gathered));
    state.push_back({"targets", gathered});
  } else {
    Dataset batch = Gather(data, rows);
    NamedTensors raw = {{"features", batch.features},
                        {"targets", batch.targets}};
    ASSIGN_OR_RETURN(ForwardInputs in,
                     task_->BuildForwardInputs(raw, step, is_eval));
    if (in.inputs.ndim() != 2 || in.inputs.dim(1) != plan_.feature_dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("task plugin \"", plan_.spec.task().plugin(),
                       "\": build_forward_inputs returned inputs ",
                       ShapeToString(in.inputs.shape()), ", block 0 takes [B, ",
                       plan_.feature_dim, "]"));
    }
    // One copy of the whole batch to the device; microbatches are views.
    ASSIGN_OR_RETURN(inputs, ctx_->ToDevice(in.inputs));
    ASSIGN_OR_RETURN(inputs, ctx_->Cast(inputs, ctx_->activation_dtype()));
    state = std::move(in.state);
    // A device loss takes its state on the device: one copy each.
    if (scalars_.has_value() && task_->plugin().has_device_loss() &&
        !options_.host_loss) {
      for (auto& [name, t] : state) {
        ASSIGN_OR_RETURN(t, ctx_->ToDevice(t));
      }
    }
  }
  for (int m = 0; m < count; ++m) {
    Microbatch& mb = MicrobatchAt(0, m);
    const int64_t lo = ranges[first + m].first - begin;
    const int64_t hi = ranges[first + m].second - begin;
    mb.input = inputs.Rows(lo, hi);
    mb.state.clear();
    for (auto& [name, t] : state) {
      mb.state.push_back({name, t.Rows(lo, hi)});
    }
  }
  return absl::OkStatus();
}

absl::Status Stage::Forward(Microbatch* mb, bool save_for_backward) {
  const Chunk& chunk = chunks_[mb->chunk];
  mb->saved.clear();
  mb->saved.resize(chunk.local_end - chunk.local_begin);
  Tensor x = mb->input;
  for (int b = chunk.local_begin; b < chunk.local_end; ++b) {
    const int i = b - chunk.local_begin;
    Tensor y;
    absl::Status st =
        blocks_[b]->Forward(store_->block_params(b), x, &y,
                            save_for_backward ? &mb->saved[i] : nullptr);
    if (!st.ok()) {
      return Prefixed(st, absl::StrCat(Where(), " block ",
                                       chunk.first_block + i, " forward: "));
    }
    x = y;
  }
  mb->output = x;
  if (!save_for_backward) mb->saved.clear();
  return absl::OkStatus();
}

absl::Status Stage::BackwardInput(Microbatch* mb) {
  const Chunk& chunk = chunks_[mb->chunk];
  Tensor d = mb->grad_output;
  for (int b = chunk.local_end - 1; b >= chunk.local_begin; --b) {
    const int i = b - chunk.local_begin;
    Tensor dx;
    // The model's input needs no gradient.
    const bool need_dx = !(i == 0 && chunk.virtual_stage == 0);
    absl::Status st =
        blocks_[b]->BackwardInput(store_->block_params(b), d,
                                  mb->saved[i].get(), need_dx ? &dx : nullptr);
    if (!st.ok()) {
      return Prefixed(st, absl::StrCat(Where(), " block ",
                                       chunk.first_block + i, " backward: "));
    }
    d = dx;
  }
  mb->grad_input = d;
  mb->grad_output = Tensor();
  return absl::OkStatus();
}

absl::Status Stage::BackwardWeight(Microbatch* mb) {
  // With the tree, each microbatch's gradient is written alone into the
  // stage's gradient buffer and then added to the tree; without it, the
  // GEMMs accumulate into the buffer directly.
  Chunk& chunk = chunks_[mb->chunk];
  const bool tree = chunk.tree.has_value();
  for (int b = chunk.local_begin; b < chunk.local_end; ++b) {
    const int i = b - chunk.local_begin;
    absl::Status st = blocks_[b]->BackwardWeight(mb->saved[i].get(),
                                                 !tree && grads_written_[b],
                                                 &store_->block_grads(b));
    if (!st.ok()) {
      return Prefixed(st,
                      absl::StrCat(Where(), " block ", chunk.first_block + i,
                                   " weight gradient: "));
    }
    grads_written_[b] = true;
  }
  if (tree) {
    absl::Status st = chunk.tree->Add(store_->grads().Rows(
        chunk.grad_offset, chunk.grad_offset + chunk.grad_size));
    if (!st.ok()) {
      return Prefixed(st, absl::StrCat(Where(), " microbatch ", mb->index,
                                       " gradient sum: "));
    }
  }
  mb->saved.clear();
  mb->input = Tensor();
  return absl::OkStatus();
}

void Stage::ResetMicrobatches(int count) {
  per_chunk_ = count;
  microbatches_.clear();
  microbatches_.resize(chunks_.size() * count);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    for (int m = 0; m < count; ++m) {
      Microbatch& mb = MicrobatchAt(static_cast<int>(c), m);
      mb.chunk = static_cast<int>(c);
      mb.index = m;
    }
  }
  held_.clear();
}

Stage::Microbatch& Stage::MicrobatchAt(int chunk, int index) {
  return microbatches_[chunk * per_chunk_ + index];
}

absl::Status Stage::Send(int virtual_stage, Message msg) {
  const StageChunk to = plan_.HolderOf(virtual_stage);
  msg.chunk = to.chunk;
  if (to.stage == index_) {
    // The tip of the V: from one chunk of this stage to the other.
    const MessageKey key{msg.kind, msg.chunk, msg.microbatch};
    if (!held_.emplace(key, std::move(msg)).second) {
      return absl::InternalError(
          absl::StrCat(Where(), ": a second hand-off of microbatch ",
                       std::get<2>(key), " to chunk ", std::get<1>(key)));
    }
    return absl::OkStatus();
  }
  if (!transport_->SharesDeviceMemory()) {
    for (auto& [name, t] : msg.tensors) {
      ASSIGN_OR_RETURN(t, ctx_->ToHost(t));
    }
  }
  return transport_->Send(to.stage, std::move(msg));
}

absl::StatusOr<Message> Stage::Receive(int virtual_stage, MessageKind kind,
                                       int64_t step, const Microbatch& mb) {
  const bool gradient = kind == MessageKind::kGradient;
  const int peer = plan_.HolderOf(virtual_stage).stage;
  const MessageKey want{kind, mb.chunk, mb.index};
  // Each receive of the step can hold at most one message back.
  const size_t max_held = microbatches_.size() * 2;
  absl::StatusOr<Message> msg;
  {
    SpanTimer t(this, &StageTimes::idle,
                gradient ? v1::SPAN_RECV_GRADIENT : v1::SPAN_RECV_ACTIVATION,
                mb.index);
    while (true) {
      if (auto it = held_.find(want); it != held_.end()) {
        msg = std::move(it->second);
        held_.erase(it);
        break;
      }
      if (peer == index_) {
        msg = absl::InternalError("it was never handed over");
        break;
      }
      msg = transport_->Recv(peer, options_.timeout);
      if (!msg.ok()) break;
      // A neighbour's snapshot (sent between its steps) is handed on, not
      // waited for: it arrives before the neighbour's next message.
      if (msg->kind == MessageKind::kSnapshot && snapshot_sink_) {
        RETURN_IF_ERROR(snapshot_sink_(peer, *std::move(msg)));
        continue;
      }
      const MessageKey got{msg->kind, msg->chunk, msg->microbatch};
      if (got == want || msg->step != step ||
          (msg->kind != MessageKind::kActivation &&
           msg->kind != MessageKind::kGradient &&
           msg->kind != MessageKind::kEvalActivation) ||
          msg->chunk < 0 || msg->chunk >= static_cast<int>(chunks_.size()) ||
          held_.size() >= max_held || held_.count(got) > 0) {
        break;  // the one awaited, or one no later receive can take
      }
      held_.emplace(got, *std::move(msg));
    }
  }
  if (!msg.ok()) {
    return Prefixed(
        msg.status(),
        absl::StrCat(
            Where(), ": receiving ",
            gradient ? "gradient" : MessageKindName(kind), " of microbatch ",
            mb.index,
            chunks_.size() > 1 ? absl::StrCat(" chunk ", mb.chunk) : "", ": "));
  }
  const bool shape_ok =
      gradient ? msg->tensors.size() == 1
               : !msg->tensors.empty() && msg->tensors[0].first == "x";
  if (msg->kind != kind || msg->step != step || msg->microbatch != mb.index ||
      msg->chunk != mb.chunk || !shape_ok) {
    return absl::InternalError(
        absl::StrCat(Where(), ": expected ", MessageKindName(kind), " of step ",
                     step, " microbatch ", mb.index, " chunk ", mb.chunk,
                     ", got ", MessageKindName(msg->kind), " of step ",
                     msg->step, " microbatch ", msg->microbatch, " chunk ",
                     msg->chunk, shape_ok ? "" : " with the wrong tensors"));
  }
  ASSIGN_OR_RETURN(msg->tensors[0].second,
                   ctx_->ToDevice(msg->tensors[0].second));
  return msg;
}

absl::Status Stage::RunSchedule(const Schedule& schedule, int64_t step,
                                bool is_eval, int num_microbatches) {
  const MessageKind act_kind =
      is_eval ? MessageKind::kEvalActivation : MessageKind::kActivation;
  for (const Action& a : schedule.stages[index_]) {
    if (a.kind == ActionKind::kOptimizerStep) continue;  // run by RunStep
    Microbatch* mb = &MicrobatchAt(a.chunk, a.microbatch);
    const int vs = chunks_[a.chunk].virtual_stage;
    switch (a.kind) {
      case ActionKind::kRecvActivation: {
        ASSIGN_OR_RETURN(Message msg, Receive(vs - 1, act_kind, step, *mb));
        mb->input = msg.tensors[0].second;
        mb->state.assign(msg.tensors.begin() + 1, msg.tensors.end());
        break;
      }
      case ActionKind::kForward: {
        {
          SpanTimer t(this, &StageTimes::forward, v1::SPAN_FORWARD,
                      mb->index);
          RETURN_IF_ERROR(Forward(mb, !is_eval));
        }
        if (vs != plan_.num_virtual_stages() - 1) break;
        // The loss belongs to the last virtual stage's forward.
        SpanTimer t(this, &StageTimes::loss, v1::SPAN_LOSS, mb->index);
        ASSIGN_OR_RETURN(mb->grad_output,
                         loss_->Compute(mb->output, mb->state, completed_steps_,
                                        first_microbatch_ + mb->index,
                                        num_microbatches, mb->index, is_eval));
        mb->output = Tensor();
        mb->state.clear();
        break;
      }
      case ActionKind::kSendActivation: {
        SpanTimer t(this, &StageTimes::comm, v1::SPAN_SEND_ACTIVATION,
                    mb->index);
        Message msg;
        msg.kind = act_kind;
        msg.step = step;
        msg.microbatch = mb->index;
        msg.tensors.push_back({"x", mb->output});
        for (auto& s : mb->state) msg.tensors.push_back(s);
        RETURN_IF_ERROR(Send(vs + 1, std::move(msg)));
        mb->output = Tensor();
        mb->state.clear();
        break;
      }
      case ActionKind::kRecvGradient: {
        ASSIGN_OR_RETURN(Message msg,
                         Receive(vs + 1, MessageKind::kGradient, step, *mb));
        mb->grad_output = msg.tensors[0].second;
        break;
      }
      case ActionKind::kBackwardInput: {
        SpanTimer t(this, &StageTimes::backward, v1::SPAN_BACKWARD_INPUT,
                    mb->index);
        RETURN_IF_ERROR(BackwardInput(mb));
        break;
      }
      case ActionKind::kSendGradient: {
        SpanTimer t(this, &StageTimes::comm, v1::SPAN_SEND_GRADIENT,
                    mb->index);
        Message msg;
        msg.kind = MessageKind::kGradient;
        msg.step = step;
        msg.microbatch = mb->index;
        msg.tensors.push_back({"dx", mb->grad_input});
        RETURN_IF_ERROR(Send(vs - 1, std::move(msg)));
        mb->grad_input = Tensor();
        break;
      }
      case ActionKind::kBackwardWeight: {
        SpanTimer t(this, &StageTimes::backward, v1::SPAN_BACKWARD_WEIGHT,
                    mb->index);
        RETURN_IF_ERROR(BackwardWeight(mb));
        break;
      }
      case ActionKind::kOptimizerStep:
        break;
    }
  }
  if (!held_.empty()) {
    const auto& [kind, chunk, index] = held_.begin()->first;
    return absl::InternalError(absl::StrCat(
        Where(), ": ", held_.size(), " message(s) no action received, e.g. ",
        MessageKindName(kind), " of microbatch ", index, " chunk ", chunk));
  }
  return absl::OkStatus();
}

absl::Status Stage::SumReplicaGradients() {
  Tensor& grads = store_->grads();
  if (options_.device_replicas != nullptr) {
    return Prefixed(options_.device_replicas->SumInTreeOrder(
                        replica_, *ctx_, &grads, options_.timeout),
                    absl::StrCat(Where(), ": "));
  }
  if (grads.device().is_cpu()) {
    return Prefixed(replica_group_->SumInTreeOrder(&grads),
                    absl::StrCat(Where(), ": "));
  }
  // Gloo works on host memory: through a host copy.
  ASSIGN_OR_RETURN(Tensor host, ctx_->HostCopy(grads));
  RETURN_IF_ERROR(Prefixed(replica_group_->SumInTreeOrder(&host),
                           absl::StrCat(Where(), ": ")));
  return ctx_->CopyInto(host, &grads);
}

absl::Status Stage::OptimizerStep(int64_t step, StepReport* report) {
  if (scalars_.has_value()) return DeviceOptimizerStep(step, report);
  StepContributions mine;
  {
    SpanTimer t(this, &StageTimes::optimizer, v1::SPAN_OPTIMIZER);
    ASSIGN_OR_RETURN(mine.sums_of_squares,
                     optimizer_->GradSumsOfSquares(store_->grads()));
  }
  return ReduceAndUpdate(step, std::move(mine), report);
}

absl::Status Stage::ReduceAndUpdate(int64_t step, StepContributions mine,
                                    StepReport* report) {
  for (size_t i = 0; i < store_->segments().size(); ++i) {
    mine.params.push_back(store_->global_index(static_cast<int>(i)));
  }
  mine.is_last = is_last();
  mine.checkpoint_file_written = checkpoint_file_written_;
  if (is_last()) {
    mine.weight_sum = loss_->weight_sum();
    mine.loss_sum = loss_->loss_sum();
    if (replicas_ > 1) {
      // Every microbatch's (w, w L) from every replica, in microbatch
      // order, summed one after another: R = 1's sums, bit for bit.
      ASSIGN_OR_RETURN(std::vector<double> all,
                       replica_group_->AllGather(loss_->terms()));
      mine.weight_sum = 0;
      mine.loss_sum = 0;
      for (size_t i = 0; i + 1 < all.size(); i += 2) {
        mine.weight_sum += all[i];
        mine.loss_sum += all[i + 1];
      }
    }
  }
  std::optional<StepTotals> totals;
  {
    // ReduceStep adds the all-reduce's own time to times.comm; the span is
    // the whole call (packing, the all-reduce, the totals).
    SpanTimer t(this, nullptr, v1::SPAN_ALL_REDUCE);
    ASSIGN_OR_RETURN(
        totals,
        ReduceStep(plan_, mine, num_stages_ > 1 ? transport_ : nullptr,
                   options_.timeout, step, Where(), &report->times.comm));
  }
  SpanTimer t(this, &StageTimes::optimizer, v1::SPAN_OPTIMIZER);
  report->loss = totals->loss;
  report->grad_norm = totals->grad_norm;
  report->checkpoint_files_written = totals->checkpoint_files_written;
  report->lr = LearningRate(plan_.spec.optimizer(), step);
  return optimizer_->Step(&store_->params(), store_->grads(), report->lr,
                          totals->grad_scale, &store_->params_bf16());
}

absl::Status Stage::DeviceOptimizerStep(int64_t step, StepReport* report) {
  const double clip = plan_.spec.optimizer().clip_grad();
  const int mine = per_chunk_;  // this replica's microbatches
  report->lr = LearningRate(plan_.spec.optimizer(), step);
  if (device_totals_) {
    // Everything on the device, then the step's one read.
    {
      SpanTimer t(this, &StageTimes::optimizer, v1::SPAN_OPTIMIZER);
      RETURN_IF_ERROR(optimizer_->GradSumsOfSquaresOnDevice(
          store_->grads(), scalars_->sums_of_squares()));
      RETURN_IF_ERROR(DeviceTotals(*ctx_, scalars_->TotalsArgs(clip)));
      RETURN_IF_ERROR(optimizer_->StepWithDeviceTotals(
          &store_->params(), store_->grads(), report->lr, scalars_->totals(),
          &store_->params_bf16()));
    }
    RETURN_IF_ERROR(ReadScalars());
    // The host learns the step's outcome, and why a refused step was
    // refused (the device left the parameters as they were).
    RETURN_IF_ERROR(loss_->Finish(step, first_microbatch_, mine,
                                  plan_.spec.parallelism().microbatches(),
                                  /*is_eval=*/false));
    const StepTotalsValues v = ComputeStepTotals(
        scalars_->host_sums_of_squares(), scalars_->num_params(),
        loss_->weight_sum(), loss_->loss_sum(), clip);
    RETURN_IF_ERROR(TotalsError(plan_, v, loss_->weight_sum(), step));
    const double* device = scalars_->host_totals();
    if (device[kTotalsSkipWord] != 0 || device[0] != v.loss ||
        device[1] != v.grad_norm || device[kTotalsScaleWord] != v.grad_scale) {
      return absl::InternalError(absl::StrCat(
          Where(), ": step ", step + 1, ": the device's totals (loss ",
          device[0], ", norm ", device[1], ", scale ", device[2], ", skip ",
          device[3], ") are not the host's (", v.loss, ", ", v.grad_norm, ", ",
          v.grad_scale, ")"));
    }
    report->loss = v.loss;
    report->grad_norm = v.grad_norm;
    report->checkpoint_files_written = checkpoint_file_written_ ? 1 : 0;
    return absl::OkStatus();
  }
  // The pipeline's all-reduce needs every stage's numbers on the host: the
  // step's one read comes first.
  StepContributions contributions;
  {
    SpanTimer t(this, &StageTimes::optimizer, v1::SPAN_OPTIMIZER);
    RETURN_IF_ERROR(optimizer_->GradSumsOfSquaresOnDevice(
        store_->grads(), scalars_->sums_of_squares()));
  }
  RETURN_IF_ERROR(ReadScalars());
  if (loss_.has_value() && loss_->on_device()) {
    RETURN_IF_ERROR(loss_->Finish(step, first_microbatch_, mine,
                                  plan_.spec.parallelism().microbatches(),
                                  /*is_eval=*/false));
  }
  const double* sums = scalars_->host_sums_of_squares();
  contributions.sums_of_squares.assign(sums, sums + scalars_->num_params());
  return ReduceAndUpdate(step, std::move(contributions), report);
}

absl::Status Stage::ReadScalars() {
  // Every mark up to here is behind the read: resolvable after it.
  read_mark_ = TimingMark();
  return scalars_->Read();
}

absl::StatusOr<StepReport> Stage::RunStep() {
  const DeviceTraffic traffic_before = ctx_->traffic();
  step_origin_ = Clock::now();
  timer_ ^= 1;  // the other timer may hold the last step's carried marks
  RETURN_IF_ERROR(timers_[timer_]->Start());
  timing_ = true;
  read_mark_ = -1;
  struct TimingOff {
    bool* on;
    ~TimingOff() { *on = false; }
  } timing_off{&timing_};
  const int64_t step = completed_steps_;  // 0-based
  const int M = plan_.spec.parallelism().microbatches();
  const int mine = M / replicas_;  // this replica's microbatches
  first_microbatch_ = replica_ * mine;
  StepReport report;
  report.step = step + 1;
  report.samples = plan_.spec.data().batch_size();
  ResetMicrobatches(mine);
  grads_written_.assign(blocks_.size(), false);
  if (loss_) loss_->Reset();
  if (scalars_.has_value()) RETURN_IF_ERROR(scalars_->Begin(mine));
  if (task_ != nullptr) {
    RETURN_IF_ERROR(task_->OnEvent(TRAINYARD_EVENT_STEP_BEGIN, step, ""));
  }
  if (is_first()) {
    SpanTimer t(this, nullptr, v1::SPAN_PREPARE_BATCH);
    RETURN_IF_ERROR(PrepareBatch(*data_.train, sampler_->Next(), step,
                                 /*is_eval=*/false, M, first_microbatch_,
                                 mine));
  }
  RETURN_IF_ERROR(RunSchedule(train_schedule_, step, false, M));
  for (Chunk& chunk : chunks_) {
    for (int b = chunk.local_begin; b < chunk.local_end; ++b) {
      if (!grads_written_[b]) {
        return absl::InternalError(absl::StrCat(
            Where(), ": block ", chunk.first_block + b - chunk.local_begin,
            " got no weight gradient"));
      }
    }
    // The tree's last fold (a few adds and one copy) is in the step's time
    // but in no phase or span: the spans stay the schedule's actions.
    if (chunk.tree.has_value()) {
      Tensor grads = store_->grads().Rows(chunk.grad_offset,
                                          chunk.grad_offset + chunk.grad_size);
      RETURN_IF_ERROR(chunk.tree->Finish(&grads));
    }
  }
  if (replicas_ > 1) {
    SpanTimer t(this, &StageTimes::comm, v1::SPAN_ALL_REDUCE, -1,
                /*traced=*/false);
    RETURN_IF_ERROR(SumReplicaGradients());
  }
  RETURN_IF_ERROR(OptimizerStep(step, &report));
  if (is_last()) {
    ASSIGN_OR_RETURN(report.metrics, task_->UpdateMetrics(false));
  }
  if (task_ != nullptr) {
    RETURN_IF_ERROR(task_->OnEvent(TRAINYARD_EVENT_STEP_END, step, ""));
  }
  microbatches_.clear();
  ++completed_steps_;
  // The step's device timeline ends at its read (device stages; what came
  // after it is resolved at the next step's), or now (the CPU).
  const int end_mark = scalars_.has_value() ? read_mark_ : TimingMark();
  timing_ = false;
  RETURN_IF_ERROR(
      ResolveSpans(scalars_.has_value() ? read_mark_ : -1, &report));
  if (end_mark >= 0) {
    ASSIGN_OR_RETURN(report.trace.step_us, timers_[timer_]->Micros(end_mark));
  }
  report.traffic = ctx_->traffic() - traffic_before;
  return report;
}

absl::StatusOr<EvalReport> Stage::RunEval() {
  const Clock::time_point start = Clock::now();
  EvalReport report;
  const int64_t rows = data_.eval_rows;
  const int64_t batch = plan_.spec.data().batch_size();
  const int M = plan_.spec.parallelism().microbatches();
  if (loss_) loss_->Reset();
  // Every replica evaluates the whole eval set (the same bits on each).
  first_microbatch_ = 0;
  int64_t eval_index = 0;
  for (int64_t begin = 0; begin < rows; begin += batch, ++eval_index) {
    const int64_t n = std::min(batch, rows - begin);
    const int parts = static_cast<int>(std::min<int64_t>(M, n));
    ResetMicrobatches(parts);
    if (scalars_.has_value()) RETURN_IF_ERROR(scalars_->Begin(parts));
    if (is_first()) {
      std::vector<int64_t> idx(n);
      for (int64_t i = 0; i < n; ++i) idx[i] = begin + i;
      RETURN_IF_ERROR(PrepareBatch(*data_.eval, idx, completed_steps_, true,
                                   parts, 0, parts));
    }
    // Eval batches are numbered in the message's step field so that a
    // stray training message can never be mistaken for one.
    RETURN_IF_ERROR(RunSchedule(
        MakeForwardOnlySchedule(num_stages_, parts, plan_.num_chunks,
                                plan_.chunk_layout),
        eval_index, true, parts));
    if (loss_.has_value() && loss_->on_device()) {
      // One read per eval batch: its loss slots.
      RETURN_IF_ERROR(scalars_->Read());
      RETURN_IF_ERROR(
          loss_->Finish(completed_steps_, 0, parts, parts, /*is_eval=*/true));
    } else if (device_data_.has_value()) {
      // The next batch reuses the pinned row indices.
      RETURN_IF_ERROR(ctx_->Synchronize());
    }
  }
  microbatches_.clear();
  report.samples = rows;
  if (is_last() && rows > 0) {
    report.loss =
        loss_->weight_sum() > 0 ? loss_->loss_sum() / loss_->weight_sum() : 0.0;
    ASSIGN_OR_RETURN(report.metrics, task_->UpdateMetrics(true));
  }
  if (step_origin_.has_value()) {
    report.span = Span{v1::SPAN_EVAL, -1, Micros(start - *step_origin_),
                       Micros(Clock::now() - *step_origin_)};
  }
  return report;
}

absl::StatusOr<SafetensorsFile> Stage::CheckpointContents(bool stable) const {
  SafetensorsFile file;
  // Copies when `stable`: the step loop goes on changing the live buffers
  // while the file is written.
  auto host = [&](const Tensor& t) {
    return stable ? ctx_->HostCopy(t) : ctx_->ToHost(t);
  };
  ASSIGN_OR_RETURN(Tensor params, host(store_->params()));
  file.tensors = store_->Slice(params);
  for (auto& [name, t] : optimizer_->StateTensors()) {
    ASSIGN_OR_RETURN(Tensor host, host(t));
    file.tensors.push_back({name, host});
  }
  if (task_ != nullptr) {
    ASSIGN_OR_RETURN(std::string state, task_->StateDict());
    ASSIGN_OR_RETURN(
        Tensor bytes,
        Tensor::Create(DType::kUInt8, {static_cast<int64_t>(state.size())}));
    if (!state.empty()) {
      std::memcpy(bytes.raw_data(), state.data(), state.size());
    }
    file.tensors.push_back({TaskStateKey(is_first() && !is_last()), bytes});
  }
  file.metadata["format"] = "trainyard-checkpoint-v1";
  file.metadata["step"] = absl::StrCat(completed_steps_);
  file.metadata["optimizer_step"] = absl::StrCat(optimizer_->step_count());
  file.metadata["stage"] = absl::StrCat(index_);
  if (is_first()) {
    file.metadata["data_position"] = absl::StrCat(sampler_->position());
  }
  return file;
}

absl::StatusOr<std::string> Stage::WriteCheckpointFile(const std::string& dir) {
  ASSIGN_OR_RETURN(SafetensorsFile file, CheckpointContents());
  return WriteStageFile(dir, completed_steps_, index_, file);
}

absl::Status Stage::RestoreCheckpoint(const std::string& dir, int64_t step) {
  // Read every stage file: parameters are found by name wherever they are.
  ASSIGN_OR_RETURN(CheckpointManifest manifest,
                   ReadCheckpointManifest(dir, step));
  const int saved_stages = static_cast<int>(manifest.stages.size());
  std::vector<SafetensorsFile> files;
  for (int k = 0; k < saved_stages; ++k) {
    ASSIGN_OR_RETURN(SafetensorsFile file,
                     ReadStageFile(dir, step, k, saved_stages));
    files.push_back(std::move(file));
  }
  return RestoreState(std::move(files), step,
                      absl::StrCat("checkpoint ", dir, " step ", step));
}

absl::Status Stage::RestoreSnapshot(absl::string_view bytes, int64_t step) {
  const std::string where =
      absl::StrCat("snapshot of stage ", index_, " after step ", step);
  // Every failure is DataLoss (a snapshot damaged or mixed up on its way),
  // which the controller restarts from checkpoints instead.
  absl::StatusOr<SafetensorsFile> file = ParseSafetensors(bytes, where);
  if (!file.ok()) return absl::DataLossError(file.status().message());
  if (file->metadata["stage"] != absl::StrCat(index_) ||
      file->metadata["step"] != absl::StrCat(step)) {
    return absl::DataLossError(
        absl::StrCat(where, ": holds stage ", file->metadata["stage"],
                     " after step ", file->metadata["step"]));
  }
  std::vector<SafetensorsFile> files;
  files.push_back(*std::move(file));
  absl::Status st = RestoreState(std::move(files), step, where);
  if (!st.ok()) return absl::DataLossError(st.message());
  return absl::OkStatus();
}

absl::Status Stage::RestoreState(std::vector<SafetensorsFile> files,
                                 int64_t step, const std::string& where) {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  for (SafetensorsFile& file : files) {
    for (auto& [name, t] : file.tensors) tensors[name] = t;
    for (auto& [key, value] : file.metadata) {
      if (key == "data_position" || key == "optimizer_step") {
        metadata[key] = value;
      }
    }
  }
  RETURN_IF_ERROR(store_->Load(tensors, where));
  int64_t opt_step = 0;
  if (!absl::SimpleAtoi(metadata["optimizer_step"], &opt_step)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": metadata optimizer_step is missing or bad"));
  }
  {
    absl::Status st = optimizer_->LoadState(tensors, opt_step);
    if (!st.ok()) return Prefixed(st, absl::StrCat(where, ": "));
  }
  if (is_first()) {
    int64_t position = 0;
    if (!absl::SimpleAtoi(metadata["data_position"], &position) ||
        position < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": metadata data_position is missing or bad: \"",
                       metadata["data_position"], "\""));
    }
    sampler_->Seek(position);
  }
  if (task_ != nullptr) {
    auto it = tensors.find(TaskStateKey(is_first() && !is_last()));
    if (it != tensors.end()) {
      const Tensor& t = it->second;
      std::string bytes(static_cast<const char*>(t.raw_data()), t.nbytes());
      RETURN_IF_ERROR(task_->LoadStateDict(bytes));
    }
  }
  completed_steps_ = step;
  return absl::OkStatus();
}

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
