#include "worker/stage.h"

#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/lr_schedule.h"
#include "core/random.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "worker/checkpoint_store.h"

namespace trainyard {

// One microbatch in flight on this stage.
struct Stage::Microbatch {
  int index = 0;
  Tensor input;  // [b, in] this stage's input
  std::vector<std::pair<std::string, Tensor>> state;  // task state, travels
  Tensor output;                     // [b, out] this stage's output
  Tensor grad_output;                // [b, out] dLoss/dOutput (scaled)
  Tensor grad_input;                 // [b, in]  to send back
  std::vector<MlpBlockSaved> saved;  // per local block
};

namespace {

class Timer {
 public:
  explicit Timer(double* acc) : acc_(acc), start_(absl::Now()) {}
  ~Timer() { *acc_ += absl::ToDoubleSeconds(absl::Now() - start_); }

 private:
  double* acc_;
  absl::Time start_;
};

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

}  // namespace

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
  const auto& spec = plan.spec;
  st->first_block_ = plan.stage_begin[index];
  for (int b = plan.stage_begin[index]; b < plan.stage_begin[index + 1]; ++b) {
    st->blocks_.emplace_back(plan.blocks[b]);
  }

  // Flat buffers and per-parameter views.
  int64_t total = 0;
  for (size_t p = 0; p < plan.params.size(); ++p) {
    const auto& ps = plan.params[p];
    if (ps.stage != index) continue;
    ParamSegment seg;
    seg.name = ps.name;
    seg.shape = ps.shape;
    seg.offset = total;
    seg.decay = ps.decay;
    total += seg.size();
    st->segments_.push_back(seg);
    st->param_index_.push_back(static_cast<int>(p));
  }
  st->params_ = Tensor::Zeros(DType::kFloat32, {total});
  st->grads_ = Tensor::Zeros(DType::kFloat32, {total});
  size_t seg = 0;
  for (size_t b = 0; b < st->blocks_.size(); ++b) {
    MlpBlockParams params, grads;
    for (Tensor* slot : params.InOrder(st->blocks_[b].config())) {
      const ParamSegment& s = st->segments_[seg];
      *slot = st->params_.Rows(s.offset, s.offset + s.size()).View(s.shape);
      ++seg;
    }
    seg -= params.InOrder(st->blocks_[b].config()).size();
    for (Tensor* slot : grads.InOrder(st->blocks_[b].config())) {
      const ParamSegment& s = st->segments_[seg];
      *slot = st->grads_.Rows(s.offset, s.offset + s.size()).View(s.shape);
      ++seg;
    }
    st->block_params_.push_back(params);
    st->block_grads_.push_back(grads);
  }
  if (seg != st->segments_.size()) {
    return absl::InternalError(absl::StrCat(st->Where(), ": plan has ",
                                            st->segments_.size(),
                                            " parameters, blocks use ", seg));
  }
  st->grads_written_.assign(st->blocks_.size(), false);

  ASSIGN_OR_RETURN(
      StageOptimizer opt,
      StageOptimizer::Create(spec.optimizer(), st->segments_, total));
  st->optimizer_.emplace(std::move(opt));

  ASSIGN_OR_RETURN(
      st->train_schedule_,
      MakeTrainingSchedule(spec.parallelism().schedule(), st->num_stages_,
                           spec.parallelism().microbatches()));
  RETURN_IF_ERROR(ValidateSchedule(st->train_schedule_));

  if (st->is_first() || st->is_last()) {
    ASSIGN_OR_RETURN(
        std::shared_ptr<const TaskPlugin> plugin,
        TaskPlugin::Load(options.plugin_dir, spec.task().plugin()));
    std::string config = "{}";
    if (spec.task().has_config()) {
      config.clear();  // MessageToJsonString appends
      if (!google::protobuf::util::MessageToJsonString(spec.task().config(),
                                                       &config)
               .ok()) {
        return absl::InvalidArgumentError("task.config: not valid JSON");
      }
    }
    ASSIGN_OR_RETURN(st->task_, Task::Create(plugin, config));
  }
  if (st->is_first()) {
    if (st->data_.train == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(st->Where(), ": first stage needs the train data"));
    }
    st->sampler_ = std::make_unique<BatchSampler>(
        st->data_.train->features.dim(0), spec.data().batch_size(),
        spec.data().shuffle(), spec.data().seed());
  }
  return st;
}

std::vector<std::pair<std::string, Tensor>> Stage::NamedParameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const ParamSegment& s : segments_) {
    out.push_back(
        {s.name, params_.Rows(s.offset, s.offset + s.size()).View(s.shape)});
  }
  return out;
}

absl::Status Stage::InitParameters() {
  const auto& init = plan_.spec.model().init();
  auto named = NamedParameters();
  if (!init.safetensors().empty()) {
    ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(init.safetensors()));
    for (auto& [name, dst] : named) {
      auto src = file.Get(name);
      if (!src.ok()) {
        return absl::NotFoundError(
            absl::StrCat("model.init.safetensors: ", init.safetensors(),
                         ": tensor ", name, " is missing"));
      }
      if (src->dtype() != DType::kFloat32 || src->shape() != dst.shape()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.init.safetensors: ", init.safetensors(), ": tensor ", name,
            " is ", DTypeName(src->dtype()), ShapeToString(src->shape()),
            ", the model needs float32", ShapeToString(dst.shape())));
      }
      dst.CopyFrom(*src);
    }
    return absl::OkStatus();
  }
  for (size_t i = 0; i < named.size(); ++i) {
    const int global = param_index_[i];
    const auto& ps = plan_.params[global];
    Tensor& t = named[i].second;
    float* p = t.data<float>();
    const int64_t n = t.numel();
    const bool is_norm = ps.name.find(".norm.") != std::string::npos;
    if (is_norm) {
      const float v = ps.name.size() >= 7 && ps.name.compare(ps.name.size() - 7,
                                                             7, ".weight") == 0
                          ? 1.0f
                          : 0.0f;
      for (int64_t k = 0; k < n; ++k) p[k] = v;
      continue;
    }
    // nn.Linear: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    const MlpBlockConfig& cfg = plan_.blocks[ps.block];
    const bool fc1 = ps.name.find(".fc1.") != std::string::npos;
    const int64_t fan_in = fc1 ? cfg.in_features : cfg.ffn_hidden_size;
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    Rng rng(plan_.spec.model().init().seed(), static_cast<uint64_t>(global));
    for (int64_t k = 0; k < n; ++k) p[k] = rng.Uniform(-bound, bound);
  }
  return absl::OkStatus();
}

absl::Status Stage::PrepareBatch(const Dataset& data, std::vector<int64_t> rows,
                                 int64_t step, bool is_eval,
                                 int num_microbatches) {
  Dataset batch = Gather(data, rows);
  NamedTensors raw = {{"features", batch.features}, {"targets", batch.targets}};
  ASSIGN_OR_RETURN(ForwardInputs in,
                   task_->BuildForwardInputs(raw, step, is_eval));
  if (in.inputs.ndim() != 2 || in.inputs.dim(1) != plan_.feature_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("task plugin \"", plan_.spec.task().plugin(),
                     "\": build_forward_inputs returned inputs ",
                     ShapeToString(in.inputs.shape()), ", block 0 takes [B, ",
                     plan_.feature_dim, "]"));
  }
  auto ranges = SplitRows(static_cast<int64_t>(rows.size()), num_microbatches);
  for (int m = 0; m < num_microbatches; ++m) {
    Microbatch& mb = microbatches_[m];
    mb.input = in.inputs.Rows(ranges[m].first, ranges[m].second);
    mb.state.clear();
    for (auto& [name, t] : in.state) {
      mb.state.push_back({name, t.Rows(ranges[m].first, ranges[m].second)});
    }
  }
  return absl::OkStatus();
}

absl::Status Stage::Forward(Microbatch* mb, bool save_for_backward) {
  mb->saved.assign(blocks_.size(), MlpBlockSaved());
  Tensor x = mb->input;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    Tensor y;
    absl::Status st =
        blocks_[b].Forward(block_params_[b], x, &y, &mb->saved[b]);
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat(Where(), " block ", first_block_ + b,
                                       " forward: ", st.message()));
    }
    x = y;
  }
  mb->output = x;
  if (!save_for_backward) mb->saved.clear();
  return absl::OkStatus();
}

absl::Status Stage::BackwardInput(Microbatch* mb) {
  Tensor d = mb->grad_output;
  for (int b = static_cast<int>(blocks_.size()) - 1; b >= 0; --b) {
    Tensor dx;
    const bool need_dx = !(b == 0 && is_first());
    absl::Status st = blocks_[b].BackwardInput(
        block_params_[b], d, &mb->saved[b], need_dx ? &dx : nullptr);
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat(Where(), " block ", first_block_ + b,
                                       " backward: ", st.message()));
    }
    d = dx;
  }
  mb->grad_input = d;
  mb->grad_output = Tensor();
  return absl::OkStatus();
}

absl::Status Stage::BackwardWeight(Microbatch* mb) {
  for (size_t b = 0; b < blocks_.size(); ++b) {
    absl::Status st = blocks_[b].BackwardWeight(
        &mb->saved[b], grads_written_[b], &block_grads_[b]);
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat(Where(), " block ", first_block_ + b,
                                       " weight gradient: ", st.message()));
    }
    grads_written_[b] = true;
  }
  mb->saved.clear();
  mb->input = Tensor();
  return absl::OkStatus();
}

absl::Status Stage::ReceiveActivation(Microbatch* mb, MessageKind kind,
                                      int64_t step, StageTimes* times) {
  absl::StatusOr<Message> msg;
  {
    Timer t(&times->idle);
    msg = transport_->Recv(index_ - 1, options_.timeout);
  }
  if (!msg.ok()) {
    return absl::Status(msg.status().code(),
                        absl::StrCat(Where(), ": receiving ",
                                     MessageKindName(kind), " of microbatch ",
                                     mb->index, ": ", msg.status().message()));
  }
  if (msg->kind != kind || msg->step != step || msg->microbatch != mb->index ||
      msg->tensors.empty() || msg->tensors[0].first != "x") {
    return absl::InternalError(absl::StrCat(
        Where(), ": expected ", MessageKindName(kind), " of step ", step,
        " microbatch ", mb->index, ", got ", MessageKindName(msg->kind),
        " of step ", msg->step, " microbatch ", msg->microbatch));
  }
  mb->input = msg->tensors[0].second;
  mb->state.assign(msg->tensors.begin() + 1, msg->tensors.end());
  return absl::OkStatus();
}

absl::Status Stage::RunSchedule(const Schedule& schedule, int64_t step,
                                bool is_eval, int num_microbatches,
                                StageTimes* times) {
  const MessageKind act_kind =
      is_eval ? MessageKind::kEvalActivation : MessageKind::kActivation;
  for (const Action& a : schedule.stages[index_]) {
    Microbatch* mb = a.microbatch >= 0 ? &microbatches_[a.microbatch] : nullptr;
    switch (a.kind) {
      case ActionKind::kRecvActivation:
        RETURN_IF_ERROR(ReceiveActivation(mb, act_kind, step, times));
        break;
      case ActionKind::kForward: {
        {
          Timer t(&times->forward);
          RETURN_IF_ERROR(Forward(mb, !is_eval));
        }
        if (!is_last()) break;
        // The loss belongs to the last stage's forward. A non-finite output
        // means the model diverged: say so here rather than let the task
        // plugin's own checks read like a plugin fault.
        {
          const float* o = mb->output.data<float>();
          for (int64_t i = 0, n = mb->output.numel(); i < n; ++i) {
            if (!std::isfinite(o[i])) {
              return absl::FailedPreconditionError(absl::StrCat(
                  "step ", completed_steps_ + 1,
                  ": the model's output for "
                  "microbatch ",
                  mb->index, " is not finite (", o[i],
                  "): the training diverged; lower optimizer.lr or set "
                  "optimizer.clip_grad"));
            }
          }
        }
        Tensor grad;
        if (!is_eval) grad = Tensor::Zeros(DType::kFloat32, mb->output.shape());
        ASSIGN_OR_RETURN(
            LossResult loss,
            task_->ComputeLoss(mb->output, mb->state, is_eval ? nullptr : &grad,
                               completed_steps_, mb->index, num_microbatches,
                               is_eval));
        weight_sum_ += loss.weight;
        loss_sum_ += loss.weight * loss.loss;
        if (!is_eval) {
          const float w = static_cast<float>(loss.weight);
          float* g = grad.data<float>();
          for (int64_t i = 0, n = grad.numel(); i < n; ++i) g[i] *= w;
          mb->grad_output = grad;
        }
        mb->output = Tensor();
        mb->state.clear();
        break;
      }
      case ActionKind::kSendActivation: {
        Timer t(&times->comm);
        Message msg;
        msg.kind = act_kind;
        msg.step = step;
        msg.microbatch = mb->index;
        msg.tensors.push_back({"x", mb->output});
        for (auto& s : mb->state) msg.tensors.push_back(s);
        RETURN_IF_ERROR(transport_->Send(index_ + 1, std::move(msg)));
        mb->output = Tensor();
        mb->state.clear();
        break;
      }
      case ActionKind::kRecvGradient: {
        absl::StatusOr<Message> msg;
        {
          Timer t(&times->idle);
          msg = transport_->Recv(index_ + 1, options_.timeout);
        }
        if (!msg.ok()) {
          return absl::Status(
              msg.status().code(),
              absl::StrCat(Where(), ": receiving gradient of microbatch ",
                           mb->index, ": ", msg.status().message()));
        }
        if (msg->kind != MessageKind::kGradient || msg->step != step ||
            msg->microbatch != mb->index || msg->tensors.size() != 1) {
          return absl::InternalError(absl::StrCat(
              Where(), ": expected gradient of step ", step, " microbatch ",
              mb->index, ", got ", MessageKindName(msg->kind), " of step ",
              msg->step, " microbatch ", msg->microbatch));
        }
        mb->grad_output = msg->tensors[0].second;
        break;
      }
      case ActionKind::kBackwardInput: {
        Timer t(&times->backward);
        RETURN_IF_ERROR(BackwardInput(mb));
        break;
      }
      case ActionKind::kSendGradient: {
        Timer t(&times->comm);
        Message msg;
        msg.kind = MessageKind::kGradient;
        msg.step = step;
        msg.microbatch = mb->index;
        msg.tensors.push_back({"dx", mb->grad_input});
        RETURN_IF_ERROR(transport_->Send(index_ - 1, std::move(msg)));
        mb->grad_input = Tensor();
        break;
      }
      case ActionKind::kBackwardWeight: {
        Timer t(&times->backward);
        RETURN_IF_ERROR(BackwardWeight(mb));
        break;
      }
      case ActionKind::kOptimizerStep:
        break;  // run by RunStep after the schedule
    }
  }
  return absl::OkStatus();
}

absl::Status Stage::OptimizerStep(int64_t step, StepReport* report) {
  const int num_params = static_cast<int>(plan_.params.size());
  std::vector<double> reduce(num_params + 2, 0.0);
  {
    Timer t(&report->times.optimizer);
    const std::vector<double> sums =
        optimizer_->GradSumsOfSquares(grads_.data<float>());
    for (size_t i = 0; i < segments_.size(); ++i) {
      reduce[param_index_[i]] = sums[i];
    }
  }
  if (is_last()) {
    reduce[num_params] = weight_sum_;
    reduce[num_params + 1] = loss_sum_;
  }
  if (num_stages_ > 1) {
    Timer t(&report->times.comm);
    absl::Status st = transport_->AllReduceSum(&reduce, options_.timeout);
    if (!st.ok()) {
      return absl::Status(
          st.code(), absl::StrCat(Where(), ": all-reduce: ", st.message()));
    }
  }
  Timer t(&report->times.optimizer);
  const double weight = reduce[num_params];
  if (!(weight > 0) || !std::isfinite(weight)) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step + 1, ": total loss weight is ", weight,
                     " (every sample was ignored by the task); step refused"));
  }
  double sumsq = 0;
  for (int p = 0; p < num_params; ++p) {
    if (!std::isfinite(reduce[p])) {
      const auto& ps = plan_.params[p];
      return absl::FailedPreconditionError(
          absl::StrCat("step ", step + 1, ": stage ", ps.stage, " parameter ",
                       ps.name, " has a non-finite gradient; step refused"));
    }
    sumsq += reduce[p];
  }
  report->loss = reduce[num_params + 1] / weight;
  report->grad_norm = std::sqrt(sumsq) / weight;
  double scale = 1.0 / weight;
  const double clip = plan_.spec.optimizer().clip_grad();
  if (clip > 0) {
    const double coef = clip / (report->grad_norm + 1e-6);
    if (coef < 1.0) scale *= coef;
  }
  report->lr = LearningRate(plan_.spec.optimizer(), step);
  optimizer_->Step(params_.data<float>(), grads_.data<float>(), report->lr,
                   scale);
  return absl::OkStatus();
}

absl::StatusOr<StepReport> Stage::RunStep() {
  const int64_t step = completed_steps_;  // 0-based
  const int M = plan_.spec.parallelism().microbatches();
  StepReport report;
  report.step = step + 1;
  report.samples = plan_.spec.data().batch_size();
  microbatches_.assign(M, Microbatch());
  for (int m = 0; m < M; ++m) microbatches_[m].index = m;
  grads_written_.assign(blocks_.size(), false);
  weight_sum_ = 0;
  loss_sum_ = 0;
  if (task_ != nullptr) {
    RETURN_IF_ERROR(task_->OnEvent(TRAINYARD_EVENT_STEP_BEGIN, step, ""));
  }
  if (is_first()) {
    RETURN_IF_ERROR(PrepareBatch(*data_.train, sampler_->Next(), step,
                                 /*is_eval=*/false, M));
  }
  RETURN_IF_ERROR(RunSchedule(train_schedule_, step, false, M, &report.times));
  for (size_t b = 0; b < blocks_.size(); ++b) {
    if (!grads_written_[b]) {
      return absl::InternalError(absl::StrCat(
          Where(), ": block ", first_block_ + b, " got no weight gradient"));
    }
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
  return report;
}

absl::StatusOr<EvalReport> Stage::RunEval() {
  EvalReport report;
  const int64_t rows = data_.eval_rows;
  const int64_t batch = plan_.spec.data().batch_size();
  const int M = plan_.spec.parallelism().microbatches();
  weight_sum_ = 0;
  loss_sum_ = 0;
  StageTimes times;
  int64_t eval_index = 0;
  for (int64_t begin = 0; begin < rows; begin += batch, ++eval_index) {
    const int64_t n = std::min(batch, rows - begin);
    const int parts = static_cast<int>(std::min<int64_t>(M, n));
    microbatches_.assign(parts, Microbatch());
    for (int m = 0; m < parts; ++m) microbatches_[m].index = m;
    if (is_first()) {
      std::vector<int64_t> idx(n);
      for (int64_t i = 0; i < n; ++i) idx[i] = begin + i;
      RETURN_IF_ERROR(
          PrepareBatch(*data_.eval, idx, completed_steps_, true, parts));
    }
    // Eval batches are numbered in the message's step field so that a
    // stray training message can never be mistaken for one.
    RETURN_IF_ERROR(RunSchedule(MakeForwardOnlySchedule(num_stages_, parts),
                                eval_index, true, parts, &times));
  }
  microbatches_.clear();
  report.samples = rows;
  if (is_last() && rows > 0) {
    report.loss = weight_sum_ > 0 ? loss_sum_ / weight_sum_ : 0.0;
    ASSIGN_OR_RETURN(report.metrics, task_->UpdateMetrics(true));
  }
  return report;
}

absl::StatusOr<std::string> Stage::WriteCheckpointFile(const std::string& dir) {
  SafetensorsFile file;
  file.tensors = NamedParameters();
  for (auto& t : optimizer_->StateTensors()) file.tensors.push_back(t);
  if (task_ != nullptr) {
    ASSIGN_OR_RETURN(std::string state, task_->StateDict());
    Tensor bytes =
        Tensor::Empty(DType::kUInt8, {static_cast<int64_t>(state.size())});
    if (!state.empty())
      std::memcpy(bytes.raw_data(), state.data(), state.size());
    file.tensors.push_back({is_first() && !is_last()
                                ? std::string("task.first_stage.state")
                                : std::string("task.last_stage.state"),
                            bytes});
  }
  file.metadata["format"] = "trainyard-checkpoint-v1";
  file.metadata["step"] = absl::StrCat(completed_steps_);
  file.metadata["optimizer_step"] = absl::StrCat(optimizer_->step_count());
  file.metadata["stage"] = absl::StrCat(index_);
  if (is_first()) {
    file.metadata["data_position"] = absl::StrCat(sampler_->position());
  }
  return WriteStageFile(dir, completed_steps_, index_, file);
}

absl::Status Stage::RestoreCheckpoint(const std::string& dir, int64_t step) {
  // Read every stage file: parameters are found by name wherever they are.
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  ASSIGN_OR_RETURN(CheckpointManifest manifest,
                   ReadCheckpointManifest(dir, step));
  const int saved_stages = static_cast<int>(manifest.stages.size());
  for (int k = 0; k < saved_stages; ++k) {
    ASSIGN_OR_RETURN(SafetensorsFile file,
                     ReadStageFile(dir, step, k, saved_stages));
    for (auto& [name, t] : file.tensors) tensors[name] = t;
    for (auto& [key, value] : file.metadata) {
      if (key == "data_position" || key == "optimizer_step") {
        metadata[key] = value;
      }
    }
  }
  const std::string where = absl::StrCat("checkpoint ", dir, " step ", step);
  for (auto& [name, dst] : NamedParameters()) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      return absl::NotFoundError(
          absl::StrCat(where, ": parameter ", name, " is missing"));
    }
    if (it->second.dtype() != DType::kFloat32 ||
        it->second.shape() != dst.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": parameter ", name, " is ", DTypeName(it->second.dtype()),
          ShapeToString(it->second.shape()), ", the model needs float32",
          ShapeToString(dst.shape())));
    }
    Tensor alias = dst;
    alias.CopyFrom(it->second);
  }
  int64_t opt_step = 0;
  if (!absl::SimpleAtoi(metadata["optimizer_step"], &opt_step)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": metadata optimizer_step is missing or bad"));
  }
  {
    absl::Status st = optimizer_->LoadState(tensors, opt_step);
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat(where, ": ", st.message()));
    }
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
    const std::string key = is_first() && !is_last() ? "task.first_stage.state"
                                                     : "task.last_stage.state";
    auto it = tensors.find(key);
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
  if (task_ == nullptr) return absl::OkStatus();
  return task_->OnEvent(kind, completed_steps_, detail);
}

absl::Status Stage::Finalize() {
  if (task_ == nullptr || finalized_) return absl::OkStatus();
  finalized_ = true;
  return task_->Finalize();
}

}  // namespace trainyard
