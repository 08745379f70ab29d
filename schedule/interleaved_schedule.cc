// Interleaved 1F1B: several model chunks per stage, laid out as a loop.
#include <algorithm>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "schedule/schedule.h"
#include "schedule/schedule_builder.h"

namespace trainyard {

absl::StatusOr<Schedule> MakeInterleavedSchedule(int S, int M, int v) {
  if (S < 1 || M < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule interleaved: needs >= 1 stage and microbatch, got ", S,
        " and ", M));
  }
  if (v < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule interleaved: needs >= 2 chunks per stage, got ",
                     v, " (with one chunk it is 1f1b)"));
  }
  if (M % S != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule interleaved: microbatches (", M,
        ") must be a multiple of stages (", S,
        "): it runs microbatches through each chunk in groups of ", S));
  }
  Schedule sched = EmptySchedule("interleaved", S, M, true);
  sched.num_chunks = v;
  sched.layout = ChunkLayout::kLoop;
  const int V = S * v;
  const int total = M * v;  // chunk passes of each kind per stage
  // The k-th chunk forward (backward) of a stage: groups of S microbatches
  // visit chunk 0, 1, ..., v-1 (backwards: v-1, ..., 0) in turn.
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % (S * v)) / S;
    return forward ? c : v - 1 - c;
  };
  auto microbatch_of = [&](int k) { return (k / (S * v)) * S + k % S; };
  for (int s = 0; s < S; ++s) {
    auto& acts = sched.stages[s];
    auto forward = [&](int k) {
      const int c = chunk_of(k, true);
      AddForward(c * S + s, V, microbatch_of(k), c, &acts);
    };
    auto backward = [&](int k) {
      const int c = chunk_of(k, false);
      AddBackward(c * S + s, V, microbatch_of(k), c, &acts);
    };
    const int warmup = std::min(2 * (S - s - 1) + (v - 1) * S, total);
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int k = 0; k < total - warmup; ++k) {
      forward(warmup + k);
      backward(k);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
    acts.push_back({ActionKind::kOptimizerStep, -1});
  }
  return sched;
}

}  // namespace trainyard
