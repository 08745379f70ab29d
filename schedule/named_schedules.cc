// What each training schedule a spec can name means: its generator, its
// default chunk count, its chunk layout and its activation bound.
#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "schedule/schedule.h"

namespace trainyard {

ChunkLayout ChunkLayoutOf(const std::string& schedule_name) {
  return schedule_name == "zbv" ? ChunkLayout::kV : ChunkLayout::kLoop;
}

int DefaultChunks(const std::string& schedule_name) {
  return schedule_name == "interleaved" || schedule_name == "zbv" ? 2 : 1;
}

int PeakChunkActivations(const std::string& name, int S, int M, int v, int s) {
  if (name == "gpipe") return M;
  if (name == "zbh1") return std::min(M, 2 * S - s - 1);
  if (name == "interleaved") {
    return std::min(v * M, 2 * (S - s - 1) + (v - 1) * S + 1);
  }
  if (name == "zbv") return std::min(2 * M, 2 * S);
  return std::min(M, S - s);  // 1f1b
}

absl::StatusOr<Schedule> MakeTrainingSchedule(const std::string& name, int S,
                                              int M, int chunks,
                                              const PassCosts& costs) {
  if (name == "interleaved") {
    return MakeInterleavedSchedule(S, M, chunks == 0 ? 2 : chunks);
  }
  if (name == "zbv") {
    if (chunks != 0 && chunks != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule zbv: holds exactly 2 chunks per stage, got ", chunks));
    }
    return MakeZeroBubbleVSchedule(S, M, costs);
  }
  if (name == "gpipe" || name == "1f1b" || name == "zbh1") {
    if (chunks != 0 && chunks != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule ", name, ": holds 1 chunk per stage, got ",
                       chunks, " (\"interleaved\" and \"zbv\" take chunks)"));
    }
    if (S < 1 || M < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule needs >= 1 stage and microbatch, got ", S, " and ", M));
    }
    if (name == "gpipe") return MakeGPipeSchedule(S, M);
    if (name == "1f1b") return MakeOneFOneBSchedule(S, M);
    return MakeZeroBubbleH1Schedule(S, M);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown schedule \"", name,
      "\" (expected \"gpipe\", \"1f1b\", \"zbh1\", \"interleaved\" or "
      "\"zbv\")"));
}

}  // namespace trainyard
