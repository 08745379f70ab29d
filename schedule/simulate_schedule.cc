// SimulateSchedule: a schedule run in time under given pass costs, and the
// bubble that follows from it.
#include <algorithm>
#include <array>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "schedule/schedule.h"

namespace trainyard {
namespace {

// Runs every stage's actions as far as their messages allow, round after
// round, until no stage can move; each action starts when its stage is free
// (and, for a receive, when the message was sent).
class Simulator {
 public:
  Simulator(const Schedule& sched, const PassCosts& costs)
      : sched_(sched),
        costs_(costs),
        S_(sched.num_stages),
        v_(sched.num_chunks),
        sent_(sched.num_virtual_stages()),
        next_(S_, 0),
        clock_(S_, 0),
        held_(S_, 0) {
    sim_.busy.assign(S_, 0);
    sim_.peak_chunk_activations.assign(S_, 0);
    sim_.timeline.resize(S_);
  }

  absl::StatusOr<ScheduleSimulation> Run() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (int s = 0; s < S_; ++s) {
        absl::Status status = RunStage(s, &progress);
        if (!status.ok()) return status;
      }
    }
    for (int s = 0; s < S_; ++s) {
      if (next_[s] < sched_.stages[s].size()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "schedule ", sched_.name, ": stage ", s, " waits forever at ",
            ActionToString(sched_.stages[s][next_[s]])));
      }
    }
    Summarize();
    return std::move(sim_);
  }

 private:
  // Runs stage `s` until a receive's message has not been sent yet or the
  // stage is done; sets `progress` when it ran anything.
  absl::Status RunStage(int s, bool* progress) {
    while (next_[s] < sched_.stages[s].size()) {
      absl::StatusOr<bool> ran = RunAction(s, sched_.stages[s][next_[s]]);
      if (!ran.ok()) return ran.status();
      if (!*ran) break;
      ++next_[s];
      *progress = true;
    }
    return absl::OkStatus();
  }

  // Runs `a` on stage `s`; false when it is a receive whose message has not
  // been sent yet.
  absl::StatusOr<bool> RunAction(int s, const Action& a) {
    const int vs = sched_.VirtualStage(s, a.chunk);
    if (vs < 0 && a.kind != ActionKind::kOptimizerStep) {
      return absl::FailedPreconditionError(absl::StrCat(
          "schedule ", sched_.name, ": stage ", s, ": ", ActionToString(a),
          ": chunk out of range [0, ", v_, ")"));
    }
    double cost = 0;
    switch (a.kind) {
      case ActionKind::kForward:
        cost = costs_.forward / v_;
        // An eval forward keeps nothing for a backward.
        if (sched_.training) {
          sim_.peak_chunk_activations[s] =
              std::max(sim_.peak_chunk_activations[s], ++held_[s]);
        }
        break;
      case ActionKind::kBackwardInput:
        cost = costs_.backward_input / v_;
        break;
      case ActionKind::kBackwardWeight:
        cost = costs_.backward_weight / v_;
        --held_[s];
        break;
      case ActionKind::kSendActivation:
        sent_[vs][0][a.microbatch] = clock_[s];
        break;
      case ActionKind::kSendGradient:
        sent_[vs][1][a.microbatch] = clock_[s];
        break;
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGradient: {
        absl::StatusOr<bool> arrived = Receive(s, vs, a);
        if (!arrived.ok() || !*arrived) return arrived;
        break;
      }
      case ActionKind::kOptimizerStep:
        break;
    }
    if (IsComputePass(a.kind)) {
      sim_.timeline[s].push_back({a, clock_[s], clock_[s] + cost});
    }
    clock_[s] += cost;
    sim_.busy[s] += cost;
    return true;
  }

  // A receive on stage `s` (virtual stage `vs`): waits until its message was
  // sent; false when it has not been sent yet.
  absl::StatusOr<bool> Receive(int s, int vs, const Action& a) {
    const bool act = a.kind == ActionKind::kRecvActivation;
    const int from = act ? vs - 1 : vs + 1;
    if (from < 0 || from >= sched_.num_virtual_stages()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "schedule ", sched_.name, ": stage ", s, " receives from no stage"));
    }
    const std::map<int, double>& channel = sent_[from][act ? 0 : 1];
    auto it = channel.find(a.microbatch);
    if (it == channel.end()) return false;  // not sent yet
    clock_[s] = std::max(clock_[s], it->second);
    return true;
  }

  // Makespan, idle time, bubbles and peaks from the finished run.
  void Summarize() {
    sim_.makespan = *std::max_element(clock_.begin(), clock_.end());
    double idle_sum = 0, busy_sum = 0;
    for (int s = 0; s < S_; ++s) {
      sim_.idle.push_back(sim_.makespan - sim_.busy[s]);
      sim_.peak_in_flight.push_back(
          static_cast<double>(sim_.peak_chunk_activations[s]) / v_);
      idle_sum += sim_.idle[s];
      busy_sum += sim_.busy[s];
      if (sim_.makespan > 0) sim_.bubble += sim_.idle[s] / sim_.makespan / S_;
    }
    if (busy_sum > 0) sim_.bubble_of_compute = idle_sum / busy_sum;
  }

  const Schedule& sched_;
  const PassCosts costs_;
  const int S_, v_;
  // When each message is available: [sender virtual stage][kind: 0
  // activation, 1 gradient] -> per microbatch.
  std::vector<std::array<std::map<int, double>, 2>> sent_;
  std::vector<size_t> next_;   // [stage] the next action to run
  std::vector<double> clock_;  // [stage] when the stage is next free
  std::vector<int> held_;      // [stage] activations held for a backward
  ScheduleSimulation sim_;
};

}  // namespace

absl::StatusOr<ScheduleSimulation> SimulateSchedule(const Schedule& sched,
                                                    const PassCosts& costs) {
  const int S = sched.num_stages;
  const int v = sched.num_chunks;
  if (S < 1 || v < 1 || static_cast<int>(sched.stages.size()) != S) {
    return absl::FailedPreconditionError(
        absl::StrCat("schedule ", sched.name, ": has ", sched.stages.size(),
                     " stage lists for ", S, " stages and ", v, " chunks"));
  }
  return Simulator(sched, costs).Run();
}

absl::StatusOr<double> SimulatedBubble(const Schedule& sched, double forward,
                                       double backward_input,
                                       double backward_weight) {
  absl::StatusOr<ScheduleSimulation> sim = SimulateSchedule(
      sched, PassCosts{forward, backward_input, backward_weight});
  if (!sim.ok()) return sim.status();
  return sim->bubble;
}

}  // namespace trainyard
