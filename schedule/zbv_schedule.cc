// ZB-V: two chunks per stage laid out as a V, the order found by a list
// scheduler (schedule.h, MakeZeroBubbleVSchedule).
#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "schedule/schedule.h"
#include "schedule/schedule_builder.h"

namespace trainyard {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

// The compute passes of one list-scheduling run, per stage in order, and
// when the last one ends.
struct ListRun {
  std::vector<std::vector<Action>> passes;
  double makespan = 0;
};

// One run of the ZB-V list scheduler (messages are free; a chunk pass
// costs half of `costs`' whole-stage pass). Whenever a stage is free it
// starts at most one pass, preferring a ready input-gradient pass (chunk 1
// first), then a ready forward its memory allows (chunk 1 first), then its
// oldest pending weight pass; with nothing ready it waits for the next
// arrival. A stage holds a (microbatch, chunk) activation from its forward
// to its weight pass; a chunk-1 forward needs fewer than 2S held, a chunk-0
// forward (which lets a new microbatch into the stage) fewer than
// clamp(S + s + cap_shift, 1, 2S). Free stages at the same moment decide in
// stage order.
class VListScheduler {
 public:
  VListScheduler(int S, int M, int cap_shift, const PassCosts& costs)
      : S_(S),
        M_(M),
        V_(2 * S),
        cap_shift_(cap_shift),
        cost_f_(costs.forward / 2),
        cost_b_(costs.backward_input / 2),
        cost_w_(costs.backward_weight / 2),
        act_ready_(V_, std::vector<double>(M, kNever)),
        grad_ready_(V_, std::vector<double>(M, kNever)),
        stages_(S) {
    std::fill(act_ready_[0].begin(), act_ready_[0].end(), 0.0);
    run_.passes.assign(S, {});
  }

  // The whole run; nullopt when it stalls (every stage waits for another).
  std::optional<ListRun> Run() {
    int remaining = PassesPerStage() * S_;
    while (remaining > 0) {
      const double t = NextFree();
      std::vector<int> blocked;
      for (int s = 0; s < S_; ++s) {
        const StageState& x = stages_[s];
        if (x.done == PassesPerStage() || x.free_at != t) continue;
        const Action pick = Pick(s, t);
        if (pick.microbatch < 0) {
          blocked.push_back(s);
          continue;
        }
        Start(s, t, pick);
        --remaining;
      }
      if (blocked.empty()) continue;
      // A blocked stage waits for the next moment anything changes: the
      // next end of a running pass (every arrival is one).
      const double next = NextEnd(t);
      if (next == kNever) return std::nullopt;  // everyone waits: stalled
      for (int s : blocked) stages_[s].free_at = next;
    }
    return std::move(run_);
  }

 private:
  struct StageState {
    std::array<int, 2> next_f{0, 0}, next_b{0, 0}, next_w{0, 0};
    int held = 0;
    double free_at = 0;
    int done = 0;
  };

  // F, B and W of every microbatch on each of the two chunks.
  int PassesPerStage() const { return 6 * M_; }

  // The virtual stage chunk `c` of stage `s` holds (layout kV).
  int VirtualStage(int s, int c) const { return c == 0 ? s : V_ - 1 - s; }

  // The next moment a stage with work left is free; every such stage
  // decides then, in stage order.
  double NextFree() const {
    double t = kNever;
    for (const StageState& x : stages_) {
      if (x.done < PassesPerStage()) t = std::min(t, x.free_at);
    }
    return t;
  }

  // The next end after `t` of a running pass, a finished stage's last
  // included; kNever when nothing runs.
  double NextEnd(double t) const {
    double next = kNever;
    for (const StageState& x : stages_) {
      if (x.free_at > t) next = std::min(next, x.free_at);
    }
    return next;
  }

  // The pass stage `s`, free at `t`, starts: a ready input-gradient pass,
  // else a ready forward its memory allows, else its oldest pending weight
  // pass, chunk 1 first each time. Microbatch -1 when none can start.
  Action Pick(int s, double t) const {
    const StageState& x = stages_[s];
    for (int c : {1, 0}) {
      const int mb = x.next_b[c];
      const int vs = VirtualStage(s, c);
      if (mb < x.next_f[c] && (vs == V_ - 1 || grad_ready_[vs][mb] <= t)) {
        return {ActionKind::kBackwardInput, mb, c};
      }
    }
    const int cap0 = std::clamp(S_ + s + cap_shift_, 1, V_);
    for (int c : {1, 0}) {
      const int mb = x.next_f[c];
      if (mb < M_ && act_ready_[VirtualStage(s, c)][mb] <= t &&
          x.held < (c == 1 ? V_ : cap0)) {
        return {ActionKind::kForward, mb, c};
      }
    }
    for (int c : {1, 0}) {
      if (x.next_w[c] < x.next_b[c]) {
        return {ActionKind::kBackwardWeight, x.next_w[c], c};
      }
    }
    return {ActionKind::kOptimizerStep, -1, 0};
  }

  // Runs `pick` on stage `s` from `t`: its output reaches the neighbouring
  // virtual stage when it ends.
  void Start(int s, double t, const Action& pick) {
    StageState& x = stages_[s];
    const int c = pick.chunk;
    const int mb = pick.microbatch;
    const int vs = VirtualStage(s, c);
    double end = t;
    switch (pick.kind) {
      case ActionKind::kForward:
        end = t + cost_f_;
        ++x.next_f[c];
        ++x.held;
        if (vs < V_ - 1) act_ready_[vs + 1][mb] = end;
        break;
      case ActionKind::kBackwardInput:
        end = t + cost_b_;
        ++x.next_b[c];
        if (vs > 0) grad_ready_[vs - 1][mb] = end;
        break;
      default:
        end = t + cost_w_;
        ++x.next_w[c];
        --x.held;
        break;
    }
    x.free_at = end;
    ++x.done;
    run_.passes[s].push_back(pick);
    run_.makespan = std::max(run_.makespan, end);
  }

  const int S_, M_, V_, cap_shift_;
  const double cost_f_, cost_b_, cost_w_;
  // When the activation (gradient) of each microbatch reaches virtual stage
  // vs from vs - 1 (vs + 1).
  std::vector<std::vector<double>> act_ready_, grad_ready_;
  std::vector<StageState> stages_;
  ListRun run_;
};

// The list-scheduled passes of the shortest step over the warm-up caps
// S + s + k tried, nearest to k = 0 first; nullopt when every run stalls.
std::optional<ListRun> ShortestListRun(int S, int M, const PassCosts& costs) {
  // At most 17 tries, so that the largest schedules a spec allows are built
  // in seconds (each try is a whole list-scheduling run).
  std::optional<ListRun> best;
  for (int i = 0; i <= std::min(2 * S, 16); ++i) {
    const int shift = (i % 2 == 0) ? -(i / 2) : (i + 1) / 2;  // 0,1,-1,...
    std::optional<ListRun> run = VListScheduler(S, M, shift, costs).Run();
    if (!run.has_value()) continue;
    const double best_makespan = best.has_value() ? best->makespan : kNever;
    if (run->makespan < best_makespan) best = std::move(run);
  }
  return best;
}

}  // namespace

absl::StatusOr<Schedule> MakeZeroBubbleVSchedule(int S, int M,
                                                 const PassCosts& costs) {
  if (S < 1 || M < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule zbv: needs >= 1 stage and microbatch, got ", S, " and ", M));
  }
  std::optional<ListRun> best = ShortestListRun(S, M, costs);
  if (!best.has_value()) {
    return absl::InternalError(absl::StrCat(
        "schedule zbv: the list scheduler stalled for every warm-up cap (S=", S,
        ", M=", M, ")"));
  }
  Schedule sched = EmptySchedule("zbv", S, M, true);
  sched.num_chunks = 2;
  sched.layout = ChunkLayout::kV;
  const int V = 2 * S;
  for (int s = 0; s < S; ++s) {
    auto& acts = sched.stages[s];
    for (const Action& p : best->passes[s]) {
      const int vs = sched.VirtualStage(s, p.chunk);
      switch (p.kind) {
        case ActionKind::kForward:
          AddForward(vs, V, p.microbatch, p.chunk, &acts);
          break;
        case ActionKind::kBackwardInput:
          AddBackwardInput(vs, V, p.microbatch, p.chunk, &acts);
          break;
        default:
          acts.push_back(p);
          break;
      }
    }
    acts.push_back({ActionKind::kOptimizerStep, -1});
  }
  return sched;
}

}  // namespace trainyard
