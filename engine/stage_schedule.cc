// Stage: the schedule interpreter. Runs the stage's actions of a schedule
// in order: receives and sends of activations and gradients (held back
// when they arrive before their receive), the passes, and the loss.
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/stage.h"

namespace trainyard {

absl::Status Stage::RunSchedule(const Schedule& schedule, int64_t step,
                                bool is_eval, int num_microbatches) {
  for (const Action& a : schedule.stages[index_]) {
    RETURN_IF_ERROR(RunAction(a, step, is_eval, num_microbatches));
  }
  if (!held_.empty()) {
    const auto& [kind, chunk, index] = held_.begin()->first;
    return absl::InternalError(absl::StrCat(
        Where(), ": ", held_.size(), " message(s) no action received, e.g. ",
        MessageKindName(kind), " of microbatch ", index, " chunk ", chunk));
  }
  return absl::OkStatus();
}

absl::Status Stage::RunAction(const Action& a, int64_t step, bool is_eval,
                              int num_microbatches) {
  if (a.kind == ActionKind::kOptimizerStep) {
    return absl::OkStatus();  // run by RunStep
  }
  const MessageKind act_kind =
      is_eval ? MessageKind::kEvalActivation : MessageKind::kActivation;
  Microbatch* mb = &MicrobatchAt(a.chunk, a.microbatch);
  const int vs = chunks_[a.chunk].virtual_stage;
  switch (a.kind) {
    case ActionKind::kRecvActivation: {
      ASSIGN_OR_RETURN(Message msg, Receive(vs - 1, act_kind, step, *mb));
      mb->input = msg.tensors[0].second;
      mb->state.assign(msg.tensors.begin() + 1, msg.tensors.end());
      return absl::OkStatus();
    }
    case ActionKind::kForward:
      return ForwardAndLoss(mb, is_eval, num_microbatches);
    case ActionKind::kSendActivation:
      return SendActivation(mb, act_kind, step);
    case ActionKind::kRecvGradient: {
      ASSIGN_OR_RETURN(Message msg,
                       Receive(vs + 1, MessageKind::kGradient, step, *mb));
      mb->grad_output = msg.tensors[0].second;
      return absl::OkStatus();
    }
    case ActionKind::kBackwardInput: {
      SpanTimer t(tracer_.get(), &StageTimes::backward, v1::SPAN_BACKWARD_INPUT,
                  mb->index);
      return BackwardInput(mb);
    }
    case ActionKind::kSendGradient:
      return SendGradient(mb, step);
    case ActionKind::kBackwardWeight: {
      if (chain_weight_passes_) {
        chained_weight_passes_.push_back(mb);
        return absl::OkStatus();
      }
      SpanTimer t(tracer_.get(), &StageTimes::backward,
                  v1::SPAN_BACKWARD_WEIGHT, mb->index);
      return BackwardWeight(mb);
    }
    case ActionKind::kOptimizerStep:
      break;
  }
  return absl::OkStatus();
}

absl::Status Stage::ForwardAndLoss(Microbatch* mb, bool is_eval,
                                   int num_microbatches) {
  {
    SpanTimer t(tracer_.get(), &StageTimes::forward, v1::SPAN_FORWARD,
                mb->index);
    RETURN_IF_ERROR(Forward(mb, !is_eval));
  }
  if (chunks_[mb->chunk].virtual_stage != plan_.num_virtual_stages() - 1) {
    return absl::OkStatus();
  }
  // The loss (an inference job's outputs) belongs to the last virtual
  // stage's forward.
  SpanTimer t(tracer_.get(), &StageTimes::loss, v1::SPAN_LOSS, mb->index);
  if (infer_sink_ != nullptr) return InferMicrobatch(mb);
  ASSIGN_OR_RETURN(mb->grad_output,
                   loss_->Compute(mb->output, mb->state, completed_steps_,
                                  first_microbatch_ + mb->index,
                                  num_microbatches, mb->index, is_eval));
  mb->output = Tensor();
  mb->state.clear();
  return absl::OkStatus();
}

absl::Status Stage::SendActivation(Microbatch* mb, MessageKind kind,
                                   int64_t step) {
  SpanTimer t(tracer_.get(), &StageTimes::comm, v1::SPAN_SEND_ACTIVATION,
              mb->index);
  Message msg;
  msg.kind = kind;
  msg.step = step;
  msg.microbatch = mb->index;
  msg.tensors.push_back({"x", mb->output});
  for (auto& s : mb->state) msg.tensors.push_back(s);
  RETURN_IF_ERROR(Send(chunks_[mb->chunk].virtual_stage + 1, std::move(msg)));
  mb->output = Tensor();
  mb->state.clear();
  return absl::OkStatus();
}

absl::Status Stage::SendGradient(Microbatch* mb, int64_t step) {
  SpanTimer t(tracer_.get(), &StageTimes::comm, v1::SPAN_SEND_GRADIENT,
              mb->index);
  Message msg;
  msg.kind = MessageKind::kGradient;
  msg.step = step;
  msg.microbatch = mb->index;
  msg.tensors.push_back({"dx", mb->grad_input});
  RETURN_IF_ERROR(Send(chunks_[mb->chunk].virtual_stage - 1, std::move(msg)));
  mb->grad_input = Tensor();
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
  absl::StatusOr<Message> msg;
  {
    SpanTimer t(tracer_.get(), &StageTimes::idle,
                gradient ? v1::SPAN_RECV_GRADIENT : v1::SPAN_RECV_ACTIVATION,
                mb.index);
    RETURN_IF_ERROR(AwaitMessage(peer, {kind, mb.chunk, mb.index}, step, &msg));
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

absl::Status Stage::AwaitMessage(int peer, const MessageKey& want, int64_t step,
                                 absl::StatusOr<Message>* msg) {
  // Each receive of the step can hold at most one message back.
  const size_t max_held = microbatches_.size() * 2;
  absl::StatusOr<Message>& m = *msg;
  while (true) {
    if (auto it = held_.find(want); it != held_.end()) {
      m = std::move(it->second);
      held_.erase(it);
      return absl::OkStatus();
    }
    if (peer == index_) {
      m = absl::InternalError("it was never handed over");
      return absl::OkStatus();
    }
    m = transport_->Recv(peer, options_.timeout);
    if (!m.ok()) return absl::OkStatus();
    // A neighbour's snapshot (sent between its steps) is handed on, not
    // waited for: it arrives before the neighbour's next message.
    if (m->kind == MessageKind::kSnapshot && snapshot_sink_) {
      RETURN_IF_ERROR(snapshot_sink_(peer, *std::move(m)));
      continue;
    }
    // The one awaited, or one no later receive can take, ends the wait;
    // any other is held for its own receive.
    const MessageKey got{m->kind, m->chunk, m->microbatch};
    if (got == want || m->step != step ||
        (m->kind != MessageKind::kActivation &&
         m->kind != MessageKind::kGradient &&
         m->kind != MessageKind::kEvalActivation) ||
        m->chunk < 0 || m->chunk >= static_cast<int>(chunks_.size()) ||
        held_.size() >= max_held || held_.count(got) > 0) {
      return absl::OkStatus();
    }
    held_.emplace(got, *std::move(m));
  }
}

}  // namespace trainyard
