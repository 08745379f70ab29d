// The schedules with one model chunk per stage: GPipe, 1F1B and ZB-H1.
#include <algorithm>
#include <climits>
#include <vector>

#include "schedule/schedule.h"
#include "schedule/schedule_builder.h"

namespace trainyard {

Schedule MakeGPipeSchedule(int S, int M) {
  Schedule sched = EmptySchedule("gpipe", S, M, true);
  for (int s = 0; s < S; ++s) {
    auto& acts = sched.stages[s];
    for (int mb = 0; mb < M; ++mb) AddForward(s, S, mb, 0, &acts);
    for (int mb = 0; mb < M; ++mb) AddBackward(s, S, mb, 0, &acts);
    acts.push_back({ActionKind::kOptimizerStep, -1});
  }
  return sched;
}

Schedule MakeOneFOneBSchedule(int S, int M) {
  Schedule sched = EmptySchedule("1f1b", S, M, true);
  for (int s = 0; s < S; ++s) {
    auto& acts = sched.stages[s];
    const int warmup = std::min(S - s - 1, M);
    for (int mb = 0; mb < warmup; ++mb) AddForward(s, S, mb, 0, &acts);
    int next_backward = 0;
    for (int mb = warmup; mb < M; ++mb) {
      AddForward(s, S, mb, 0, &acts);
      AddBackward(s, S, next_backward++, 0, &acts);
    }
    while (next_backward < M) AddBackward(s, S, next_backward++, 0, &acts);
    acts.push_back({ActionKind::kOptimizerStep, -1});
  }
  return sched;
}

Schedule MakeZeroBubbleH1Schedule(int S, int M) {
  // A list scheduler in unit time (F = B = W = 1, free messages): at each
  // tick each stage starts at most one pass, preferring a ready input
  // gradient (it unblocks the stage before), then a forward if it has
  // fewer than S - s microbatches between forward and input gradient (1F1B's
  // warm-up) and fewer than 2S - s - 1 whose weight pass is still pending,
  // then its oldest pending weight pass. So weight passes move into what
  // would be idle time, and the steady state stays 1F1B's. At F = B = W
  // this reaches the zero-bubble paper's ZB-H1 step, 3M + S - 1, idle
  // (S - 1) per stage (tested); weight passes stay in ascending order.
  Schedule sched = EmptySchedule("zbh1", S, M, true);
  const int kNever = INT_MAX;
  std::vector<std::vector<int>> act_ready(S, std::vector<int>(M, kNever));
  std::vector<std::vector<int>> grad_ready(S, std::vector<int>(M, kNever));
  std::fill(act_ready[0].begin(), act_ready[0].end(), 0);
  std::vector<int> next_f(S, 0), next_b(S, 0), next_w(S, 0);
  int remaining = 3 * S * M;
  for (int t = 0; remaining > 0; ++t) {
    for (int s = 0; s < S; ++s) {
      auto& acts = sched.stages[s];
      const int b = next_b[s], f = next_f[s];
      if (b < f && (s == S - 1 || grad_ready[s][b] <= t)) {
        AddBackwardInput(s, S, b, 0, &acts);
        ++next_b[s];
        if (s > 0) grad_ready[s - 1][b] = t + 1;
      } else if (f < M && act_ready[s][f] <= t && f - b < S - s &&
                 f - next_w[s] < 2 * S - s - 1) {
        AddForward(s, S, f, 0, &acts);
        ++next_f[s];
        if (s < S - 1) act_ready[s + 1][f] = t + 1;
      } else if (next_w[s] < b) {
        acts.push_back({ActionKind::kBackwardWeight, next_w[s]++});
      } else {
        continue;
      }
      --remaining;
    }
    // Never taken (every stage always has a pass it may start within S
    // ticks; the tests cover S <= 8, M <= 16): a stall would leave passes
    // out, which ValidateSchedule, run on every schedule a stage uses,
    // reports.
    if (t > 6 * S * M + 2 * S) break;
  }
  for (auto& acts : sched.stages) {
    acts.push_back({ActionKind::kOptimizerStep, -1});
  }
  return sched;
}

}  // namespace trainyard
