// ValidateSchedule: a schedule's shape, each stage's ordering rules, then the
// message flow between stages (schedule.h, "Semantics").
#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "schedule/schedule.h"

namespace trainyard {
namespace {

absl::Status StageError(const Schedule& sched, int s, const std::string& why) {
  return absl::FailedPreconditionError(
      absl::StrCat("schedule ", sched.name, ": stage ", s, ": ", why));
}

// One action list per stage, at least one stage and microbatch, and a chunk
// count the layout takes.
absl::Status CheckShape(const Schedule& sched) {
  const int S = sched.num_stages;
  const int M = sched.num_microbatches;
  const int v = sched.num_chunks;
  if (S < 1 || M < 1 || static_cast<int>(sched.stages.size()) != S) {
    return absl::FailedPreconditionError(absl::StrCat(
        "schedule ", sched.name, ": has ", sched.stages.size(),
        " stage lists for ", S, " stages and ", M, " microbatches"));
  }
  if (v < 1 || (sched.layout == ChunkLayout::kV && v > 2)) {
    return absl::FailedPreconditionError(
        absl::StrCat("schedule ", sched.name, ": ", v,
                     " chunks per stage (must be >= 1; at most 2 for the V "
                     "layout)"));
  }
  return absl::OkStatus();
}

// The ordering rules within one stage: each action in range, after what it
// needs and only once; the loss forwards and the weight passes in ascending
// microbatch order; then every pass and send of every (chunk, microbatch)
// present and exactly one optimizer step, last.
class StageChecker {
 public:
  StageChecker(const Schedule& sched, int s)
      : sched_(sched),
        s_(s),
        v_(sched.num_chunks),
        M_(sched.num_microbatches),
        unit_(v_ > 1 ? "virtual stage" : "stage"),
        fwd_(PerChunk()),
        bin_(PerChunk()),
        bw_(PerChunk()),
        recv_act_(PerChunk()),
        sent_act_(PerChunk()),
        recv_grad_(PerChunk()),
        sent_grad_(PerChunk()),
        next_weight_(v_, 0) {}

  absl::Status Check() {
    for (const Action& a : sched_.stages[s_]) {
      absl::Status status = CheckAction(a);
      if (!status.ok()) return status;
    }
    return CheckComplete();
  }

 private:
  // How often each action ran, [chunk][microbatch].
  using Counts = std::vector<std::vector<int>>;

  Counts PerChunk() const { return Counts(v_, std::vector<int>(M_, 0)); }
  absl::Status Fail(const std::string& why) const {
    return StageError(sched_, s_, why);
  }
  // Whether chunk `c` of this stage is the first (last) virtual stage.
  bool IsFirst(int c) const { return sched_.VirtualStage(s_, c) == 0; }
  bool IsLast(int c) const {
    return sched_.VirtualStage(s_, c) == sched_.num_virtual_stages() - 1;
  }

  absl::Status CheckAction(const Action& a) {
    const std::string what = ActionToString(a);
    if (optimizer_steps_ > 0) return Fail(what + " after optimizer-step");
    if (a.kind == ActionKind::kOptimizerStep) {
      if (!sched_.training) return Fail("optimizer-step in forward-only");
      ++optimizer_steps_;
      return absl::OkStatus();
    }
    if (a.chunk < 0 || a.chunk >= v_) {
      return Fail(absl::StrCat(what, ": chunk out of range [0, ", v_, ")"));
    }
    if (a.microbatch < 0 || a.microbatch >= M_) {
      return Fail(
          absl::StrCat(what, ": microbatch out of range [0, ", M_, ")"));
    }
    switch (a.kind) {
      case ActionKind::kRecvActivation:
      case ActionKind::kForward:
      case ActionKind::kSendActivation:
        return CheckActivationSide(a, what);
      default:
        return CheckGradientSide(a, what);
    }
  }

  // A receive, forward or send of an activation.
  absl::Status CheckActivationSide(const Action& a, const std::string& what) {
    const int mb = a.microbatch;
    const int c = a.chunk;
    const bool first = IsFirst(c);
    const bool last = IsLast(c);
    switch (a.kind) {
      case ActionKind::kRecvActivation:
        if (first) {
          return Fail(absl::StrCat(what, ": first ", unit_, " has no sender"));
        }
        if (recv_act_[c][mb]++) return Fail(what + " twice");
        break;
      case ActionKind::kForward:
        if (!first && !recv_act_[c][mb]) return Fail(what + " before <A");
        if (fwd_[c][mb]++) return Fail(what + " twice");
        // The loss head sums its terms in the order of these forwards.
        if (last && mb != next_loss_++) {
          return Fail(absl::StrCat(what, ": the last ", unit_,
                                   " must run its forwards (the loss) in "
                                   "ascending microbatch order, expected "
                                   "microbatch ",
                                   next_loss_ - 1));
        }
        break;
      default:  // kSendActivation
        if (last) {
          return Fail(absl::StrCat(what, ": last ", unit_, " has no receiver"));
        }
        if (!fwd_[c][mb]) return Fail(what + " before its forward");
        if (sent_act_[c][mb]++) return Fail(what + " twice");
        break;
    }
    return absl::OkStatus();
  }

  // A receive, backward pass or send of a gradient.
  absl::Status CheckGradientSide(const Action& a, const std::string& what) {
    const int mb = a.microbatch;
    const int c = a.chunk;
    const bool first = IsFirst(c);
    const bool last = IsLast(c);
    switch (a.kind) {
      case ActionKind::kRecvGradient:
        if (!sched_.training) return Fail(what + " in forward-only");
        if (last) {
          return Fail(absl::StrCat(what, ": last ", unit_, " has no sender"));
        }
        if (recv_grad_[c][mb]++) return Fail(what + " twice");
        break;
      case ActionKind::kBackwardInput:
        if (!sched_.training) return Fail(what + " in forward-only");
        if (!fwd_[c][mb]) return Fail(what + " before its forward");
        if (!last && !recv_grad_[c][mb]) return Fail(what + " before <G");
        if (bin_[c][mb]++) return Fail(what + " twice");
        break;
      case ActionKind::kSendGradient:
        if (first) {
          return Fail(
              absl::StrCat(what, ": first ", unit_, " has no receiver"));
        }
        if (!bin_[c][mb]) return Fail(what + " before its backward-input");
        if (sent_grad_[c][mb]++) return Fail(what + " twice");
        break;
      default:  // kBackwardWeight
        return CheckWeightPass(a, what);
    }
    return absl::OkStatus();
  }

  absl::Status CheckWeightPass(const Action& a, const std::string& what) {
    const int mb = a.microbatch;
    const int c = a.chunk;
    if (!bin_[c][mb]) return Fail(what + " before its backward-input");
    if (bw_[c][mb]++) return Fail(what + " twice");
    // Gradients accumulate in this order; ascending order under every
    // schedule is what keeps results bitwise equal across schedules.
    if (mb != next_weight_[c]) {
      return Fail(
          what +
          ": weight gradients must run in ascending microbatch "
          "order, expected " +
          ActionToString({ActionKind::kBackwardWeight, next_weight_[c], c}));
    }
    ++next_weight_[c];
    return absl::OkStatus();
  }

  // Every pass and send each (chunk, microbatch) needs, and one optimizer
  // step when training.
  absl::Status CheckComplete() const {
    const int V = sched_.num_virtual_stages();
    for (int c = 0; c < v_; ++c) {
      const int vs = sched_.VirtualStage(s_, c);
      for (int mb = 0; mb < M_; ++mb) {
        const std::string m =
            absl::StrCat(" of microbatch ", mb,
                         v_ > 1 ? absl::StrCat(", chunk ", c) : std::string());
        if (!fwd_[c][mb]) return Fail("no forward" + m);
        if (vs < V - 1 && !sent_act_[c][mb]) {
          return Fail("no send-activation" + m);
        }
        if (sched_.training) {
          if (!bin_[c][mb]) return Fail("no backward-input" + m);
          if (!bw_[c][mb]) return Fail("no backward-weight" + m);
          if (vs > 0 && !sent_grad_[c][mb]) {
            return Fail("no send-gradient" + m);
          }
        }
      }
    }
    if (sched_.training && optimizer_steps_ != 1) {
      return Fail("needs exactly one optimizer-step at the end");
    }
    return absl::OkStatus();
  }

  const Schedule& sched_;
  const int s_, v_, M_;
  const char* const unit_;
  Counts fwd_, bin_, bw_, recv_act_, sent_act_, recv_grad_, sent_grad_;
  std::vector<int> next_weight_;  // [chunk]
  int next_loss_ = 0;             // the last virtual stage's next forward
  int optimizer_steps_ = 0;
};

// Runs the stages against each other with buffered sends and blocking FIFO
// receives: every receive must find its microbatch next on its channel, no
// stage may wait forever, and no message may be left over.
class MessageFlow {
 public:
  explicit MessageFlow(const Schedule& sched)
      : sched_(sched),
        act_(sched.num_virtual_stages()),
        grad_(sched.num_virtual_stages()),
        pc_(sched.num_stages, 0) {}

  absl::Status Run() {
    while (true) {
      bool progressed = false;
      bool done = true;
      for (int s = 0; s < sched_.num_stages; ++s) {
        absl::Status status = RunStage(s, &progressed);
        if (!status.ok()) return status;
        if (pc_[s] < sched_.stages[s].size()) done = false;
      }
      if (done) break;
      if (!progressed) return Deadlock();
    }
    return CheckDrained();
  }

 private:
  // Runs stage `s` until a receive finds its channel empty or the stage is
  // done; sets `progressed` when it ran anything.
  absl::Status RunStage(int s, bool* progressed) {
    const auto& acts = sched_.stages[s];
    while (pc_[s] < acts.size()) {
      const Action& a = acts[pc_[s]];
      const int vs = sched_.VirtualStage(s, a.chunk);
      std::deque<int>* in = nullptr;
      if (a.kind == ActionKind::kRecvActivation) in = &act_[vs - 1];
      if (a.kind == ActionKind::kRecvGradient) in = &grad_[vs];
      if (in != nullptr) {
        if (in->empty()) break;  // blocked
        if (in->front() != a.microbatch) {
          return StageError(sched_, s,
                            absl::StrCat(ActionToString(a),
                                         ": next message on its channel is "
                                         "for microbatch ",
                                         in->front()));
        }
        in->pop_front();
      }
      if (a.kind == ActionKind::kSendActivation) {
        act_[vs].push_back(a.microbatch);
      }
      if (a.kind == ActionKind::kSendGradient) {
        grad_[vs - 1].push_back(a.microbatch);
      }
      ++pc_[s];
      *progressed = true;
    }
    return absl::OkStatus();
  }

  absl::Status Deadlock() const {
    std::vector<std::string> waiting;
    for (int s = 0; s < sched_.num_stages; ++s) {
      if (pc_[s] < sched_.stages[s].size()) {
        waiting.push_back(absl::StrCat(
            "stage ", s, " at ", ActionToString(sched_.stages[s][pc_[s]])));
      }
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "schedule ", sched_.name, ": deadlock: ", absl::StrJoin(waiting, ", "),
        " wait forever"));
  }

  absl::Status CheckDrained() const {
    for (int vs = 0; vs < sched_.num_virtual_stages(); ++vs) {
      if (!act_[vs].empty() || !grad_[vs].empty()) {
        const int sender = StageChunkOf(sched_.layout, sched_.num_stages,
                                        sched_.num_chunks, vs)
                               .stage;
        return StageError(sched_, sender, "messages sent but never received");
      }
    }
    return absl::OkStatus();
  }

  const Schedule& sched_;
  // act_[vs]: activations in flight from virtual stage vs to vs + 1;
  // grad_[vs]: gradients from vs + 1 to vs.
  std::vector<std::deque<int>> act_, grad_;
  std::vector<size_t> pc_;  // [stage] the next action to run
};

}  // namespace

absl::Status ValidateSchedule(const Schedule& sched) {
  absl::Status status = CheckShape(sched);
  for (int s = 0; status.ok() && s < sched.num_stages; ++s) {
    status = StageChecker(sched, s).Check();
  }
  if (!status.ok()) return status;
  return MessageFlow(sched).Run();
}

}  // namespace trainyard
