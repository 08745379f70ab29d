#include "core/schedule.h"

#include <algorithm>
#include <array>
#include <deque>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainyard {

const char* ActionKindName(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return "forward";
    case ActionKind::kBackwardInput:
      return "backward-input";
    case ActionKind::kBackwardWeight:
      return "backward-weight";
    case ActionKind::kSendActivation:
      return "send-activation";
    case ActionKind::kRecvActivation:
      return "recv-activation";
    case ActionKind::kSendGradient:
      return "send-gradient";
    case ActionKind::kRecvGradient:
      return "recv-gradient";
    case ActionKind::kOptimizerStep:
      return "optimizer-step";
  }
  return "?";
}

std::string ActionToString(const Action& a) {
  const char* prefix = "?";
  switch (a.kind) {
    case ActionKind::kForward:
      prefix = "F";
      break;
    case ActionKind::kBackwardInput:
      prefix = "B";
      break;
    case ActionKind::kBackwardWeight:
      prefix = "W";
      break;
    case ActionKind::kSendActivation:
      prefix = ">A";
      break;
    case ActionKind::kRecvActivation:
      prefix = "<A";
      break;
    case ActionKind::kSendGradient:
      prefix = ">G";
      break;
    case ActionKind::kRecvGradient:
      prefix = "<G";
      break;
    case ActionKind::kOptimizerStep:
      return "OPT";
  }
  return absl::StrCat(prefix, a.microbatch);
}

std::string Schedule::ToString() const {
  std::string out;
  for (size_t s = 0; s < stages.size(); ++s) {
    std::vector<std::string> parts;
    for (const Action& a : stages[s]) parts.push_back(ActionToString(a));
    absl::StrAppend(&out, "stage ", s, ": ", absl::StrJoin(parts, " "), "\n");
  }
  return out;
}

namespace {

void AddForward(int s, int S, int mb, std::vector<Action>* out) {
  if (s > 0) out->push_back({ActionKind::kRecvActivation, mb});
  out->push_back({ActionKind::kForward, mb});
  if (s < S - 1) out->push_back({ActionKind::kSendActivation, mb});
}

void AddBackward(int s, int S, int mb, std::vector<Action>* out) {
  if (s < S - 1) out->push_back({ActionKind::kRecvGradient, mb});
  out->push_back({ActionKind::kBackwardInput, mb});
  if (s > 0) out->push_back({ActionKind::kSendGradient, mb});
  out->push_back({ActionKind::kBackwardWeight, mb});
}

Schedule Empty(const char* name, int S, int M, bool training) {
  Schedule sched;
  sched.name = name;
  sched.num_stages = S;
  sched.num_microbatches = M;
  sched.training = training;
  sched.stages.resize(S);
  return sched;
}

}  // namespace

Schedule MakeGPipeSchedule(int S, int M) {
  Schedule sched = Empty("gpipe", S, M, true);
  for (int s = 0; s < S; ++s) {
    auto& acts = sched.stages[s];
    for (int mb = 0; mb < M; ++mb) AddForward(s, S, mb, &acts);
    for (int mb = 0; mb < M; ++mb) AddBackward(s, S, mb, &acts);
    acts.push_back({ActionKind::kOptimizerStep, -1});
  }
  return sched;
}

Schedule MakeOneFOneBSchedule(int S, int M) {
  Schedule sched = Empty("1f1b", S, M, true);
  for (int s = 0; s < S; ++s) {
    auto& acts = sched.stages[s];
    const int warmup = std::min(S - s - 1, M);
    for (int mb = 0; mb < warmup; ++mb) AddForward(s, S, mb, &acts);
    int next_backward = 0;
    for (int mb = warmup; mb < M; ++mb) {
      AddForward(s, S, mb, &acts);
      AddBackward(s, S, next_backward++, &acts);
    }
    while (next_backward < M) AddBackward(s, S, next_backward++, &acts);
    acts.push_back({ActionKind::kOptimizerStep, -1});
  }
  return sched;
}

Schedule MakeZeroBubbleH1Schedule(int S, int M) {
  Schedule sched = Empty("zbh1", S, M, true);
  for (int s = 0; s < S; ++s) {
    auto& acts = sched.stages[s];
    const int warmup = std::min(S - s - 1, M);
    const int first_deferred = M - warmup;  // W of these mbs runs last
    auto backward = [&](int mb) {
      if (s < S - 1) acts.push_back({ActionKind::kRecvGradient, mb});
      acts.push_back({ActionKind::kBackwardInput, mb});
      if (s > 0) acts.push_back({ActionKind::kSendGradient, mb});
      if (mb < first_deferred)
        acts.push_back({ActionKind::kBackwardWeight, mb});
    };
    for (int mb = 0; mb < warmup; ++mb) AddForward(s, S, mb, &acts);
    int next_backward = 0;
    for (int mb = warmup; mb < M; ++mb) {
      AddForward(s, S, mb, &acts);
      backward(next_backward++);
    }
    while (next_backward < M) backward(next_backward++);
    for (int mb = first_deferred; mb < M; ++mb) {
      acts.push_back({ActionKind::kBackwardWeight, mb});
    }
    acts.push_back({ActionKind::kOptimizerStep, -1});
  }
  return sched;
}

Schedule MakeForwardOnlySchedule(int S, int M) {
  Schedule sched = Empty("forward", S, M, false);
  for (int s = 0; s < S; ++s) {
    for (int mb = 0; mb < M; ++mb) AddForward(s, S, mb, &sched.stages[s]);
  }
  return sched;
}

absl::StatusOr<Schedule> MakeTrainingSchedule(const std::string& name, int S,
                                              int M) {
  if (S < 1 || M < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule needs >= 1 stage and microbatch, got ", S, " and ", M));
  }
  if (name == "gpipe") return MakeGPipeSchedule(S, M);
  if (name == "1f1b") return MakeOneFOneBSchedule(S, M);
  if (name == "zbh1") return MakeZeroBubbleH1Schedule(S, M);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule \"", name,
                   "\" (expected \"gpipe\", \"1f1b\" or \"zbh1\")"));
}

absl::Status ValidateSchedule(const Schedule& sched) {
  const int S = sched.num_stages;
  const int M = sched.num_microbatches;
  auto fail = [&](int s, const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("schedule ", sched.name, ": stage ", s, ": ", why));
  };
  if (S < 1 || M < 1 || static_cast<int>(sched.stages.size()) != S) {
    return absl::FailedPreconditionError(absl::StrCat(
        "schedule ", sched.name, ": has ", sched.stages.size(),
        " stage lists for ", S, " stages and ", M, " microbatches"));
  }
  // Per-stage ordering rules.
  for (int s = 0; s < S; ++s) {
    std::vector<int> fwd(M, 0), bin(M, 0), bw(M, 0);
    std::vector<int> recv_act(M, 0), sent_act(M, 0), recv_grad(M, 0),
        sent_grad(M, 0);
    int optimizer_steps = 0;
    int next_weight = 0;
    for (const Action& a : sched.stages[s]) {
      const std::string what = ActionToString(a);
      if (optimizer_steps > 0) return fail(s, what + " after optimizer-step");
      if (a.kind == ActionKind::kOptimizerStep) {
        if (!sched.training) return fail(s, "optimizer-step in forward-only");
        ++optimizer_steps;
        continue;
      }
      if (a.microbatch < 0 || a.microbatch >= M) {
        return fail(
            s, absl::StrCat(what, ": microbatch out of range [0, ", M, ")"));
      }
      const int mb = a.microbatch;
      switch (a.kind) {
        case ActionKind::kRecvActivation:
          if (s == 0) return fail(s, what + ": first stage has no sender");
          if (recv_act[mb]++) return fail(s, what + " twice");
          break;
        case ActionKind::kForward:
          if (s > 0 && !recv_act[mb]) return fail(s, what + " before <A");
          if (fwd[mb]++) return fail(s, what + " twice");
          break;
        case ActionKind::kSendActivation:
          if (s == S - 1) return fail(s, what + ": last stage has no receiver");
          if (!fwd[mb]) return fail(s, what + " before its forward");
          if (sent_act[mb]++) return fail(s, what + " twice");
          break;
        case ActionKind::kRecvGradient:
          if (!sched.training) return fail(s, what + " in forward-only");
          if (s == S - 1) return fail(s, what + ": last stage has no sender");
          if (recv_grad[mb]++) return fail(s, what + " twice");
          break;
        case ActionKind::kBackwardInput:
          if (!sched.training) return fail(s, what + " in forward-only");
          if (!fwd[mb]) return fail(s, what + " before its forward");
          if (s < S - 1 && !recv_grad[mb]) return fail(s, what + " before <G");
          if (bin[mb]++) return fail(s, what + " twice");
          break;
        case ActionKind::kSendGradient:
          if (s == 0) return fail(s, what + ": first stage has no receiver");
          if (!bin[mb]) return fail(s, what + " before its backward-input");
          if (sent_grad[mb]++) return fail(s, what + " twice");
          break;
        case ActionKind::kBackwardWeight:
          if (!bin[mb]) return fail(s, what + " before its backward-input");
          if (bw[mb]++) return fail(s, what + " twice");
          // Gradients accumulate in this order; ascending order under every
          // schedule is what keeps results bitwise equal across schedules.
          if (mb != next_weight) {
            return fail(s, absl::StrCat(what,
                                        ": weight gradients must run in "
                                        "ascending microbatch order, "
                                        "expected W",
                                        next_weight));
          }
          ++next_weight;
          break;
        case ActionKind::kOptimizerStep:
          break;
      }
    }
    for (int mb = 0; mb < M; ++mb) {
      const std::string m = absl::StrCat(" of microbatch ", mb);
      if (!fwd[mb]) return fail(s, "no forward" + m);
      if (s < S - 1 && !sent_act[mb]) return fail(s, "no send-activation" + m);
      if (sched.training) {
        if (!bin[mb]) return fail(s, "no backward-input" + m);
        if (!bw[mb]) return fail(s, "no backward-weight" + m);
        if (s > 0 && !sent_grad[mb]) return fail(s, "no send-gradient" + m);
      }
    }
    if (sched.training && optimizer_steps != 1) {
      return fail(s, "needs exactly one optimizer-step at the end");
    }
  }

  // Simulate: buffered sends, blocking FIFO receives.
  // act[s]: activations in flight from s to s+1; grad[s]: from s+1 to s.
  std::vector<std::deque<int>> act(S), grad(S);
  std::vector<size_t> pc(S, 0);
  while (true) {
    bool progressed = false;
    bool done = true;
    for (int s = 0; s < S; ++s) {
      const auto& acts = sched.stages[s];
      while (pc[s] < acts.size()) {
        const Action& a = acts[pc[s]];
        std::deque<int>* in = nullptr;
        if (a.kind == ActionKind::kRecvActivation) in = &act[s - 1];
        if (a.kind == ActionKind::kRecvGradient) in = &grad[s];
        if (in != nullptr) {
          if (in->empty()) break;  // blocked
          if (in->front() != a.microbatch) {
            return fail(s, absl::StrCat(ActionToString(a),
                                        ": next message on its channel is "
                                        "for microbatch ",
                                        in->front()));
          }
          in->pop_front();
        }
        if (a.kind == ActionKind::kSendActivation)
          act[s].push_back(a.microbatch);
        if (a.kind == ActionKind::kSendGradient)
          grad[s - 1].push_back(a.microbatch);
        ++pc[s];
        progressed = true;
      }
      if (pc[s] < acts.size()) done = false;
    }
    if (done) break;
    if (!progressed) {
      std::vector<std::string> waiting;
      for (int s = 0; s < S; ++s) {
        if (pc[s] < sched.stages[s].size()) {
          waiting.push_back(absl::StrCat(
              "stage ", s, " at ", ActionToString(sched.stages[s][pc[s]])));
        }
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "schedule ", sched.name, ": deadlock: ", absl::StrJoin(waiting, ", "),
          " wait forever"));
    }
  }
  for (int s = 0; s < S; ++s) {
    if (!act[s].empty() || !grad[s].empty()) {
      return fail(s, "messages sent but never received");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> SimulatedBubble(const Schedule& sched, double forward,
                                       double backward_input,
                                       double backward_weight) {
  const int S = sched.num_stages;
  // When each message is available: [from stage][kind: 0 activation, 1
  // gradient] -> per microbatch, in send order.
  std::vector<std::array<std::map<int, double>, 2>> sent(S);
  std::vector<size_t> next(S, 0);
  std::vector<double> clock(S, 0), busy(S, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < S; ++s) {
      while (next[s] < sched.stages[s].size()) {
        const Action& a = sched.stages[s][next[s]];
        double cost = 0;
        switch (a.kind) {
          case ActionKind::kForward:
            cost = forward;
            break;
          case ActionKind::kBackwardInput:
            cost = backward_input;
            break;
          case ActionKind::kBackwardWeight:
            cost = backward_weight;
            break;
          case ActionKind::kSendActivation:
            sent[s][0][a.microbatch] = clock[s];
            break;
          case ActionKind::kSendGradient:
            sent[s][1][a.microbatch] = clock[s];
            break;
          case ActionKind::kRecvActivation:
          case ActionKind::kRecvGradient: {
            const bool act = a.kind == ActionKind::kRecvActivation;
            const int from = act ? s - 1 : s + 1;
            if (from < 0 || from >= S) {
              return absl::FailedPreconditionError(
                  absl::StrCat("schedule ", sched.name, ": stage ", s,
                               " receives from no stage"));
            }
            auto& channel = sent[from][act ? 0 : 1];
            auto it = channel.find(a.microbatch);
            if (it == channel.end()) goto blocked;  // not sent yet
            clock[s] = std::max(clock[s], it->second);
            break;
          }
          case ActionKind::kOptimizerStep:
            break;
        }
        clock[s] += cost;
        busy[s] += cost;
        ++next[s];
        progress = true;
      }
    blocked:;
    }
  }
  for (int s = 0; s < S; ++s) {
    if (next[s] < sched.stages[s].size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "schedule ", sched.name, ": stage ", s, " waits forever at ",
          ActionToString(sched.stages[s][next[s]])));
    }
  }
  const double makespan = *std::max_element(clock.begin(), clock.end());
  if (makespan <= 0) return 0.0;
  double idle = 0;
  for (int s = 0; s < S; ++s) idle += (makespan - busy[s]) / makespan;
  return idle / S;
}

}  // namespace trainyard
