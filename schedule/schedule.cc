// The schedule data model: actions, their names, and the chunk layouts.
#include "schedule/schedule.h"

#include <string>
#include <vector>

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

bool IsComputePass(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackwardInput ||
         kind == ActionKind::kBackwardWeight;
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
  if (a.chunk == 0) return absl::StrCat(prefix, a.microbatch);
  return absl::StrCat(prefix, a.microbatch, ".", a.chunk);
}

int VirtualStageOf(ChunkLayout layout, int S, int v, int stage, int chunk) {
  if (stage < 0 || stage >= S || chunk < 0 || chunk >= v) return -1;
  if (layout == ChunkLayout::kV) {
    if (v == 1) return stage;
    if (v != 2) return -1;
    return chunk == 0 ? stage : 2 * S - 1 - stage;
  }
  return chunk * S + stage;
}

StageChunk StageChunkOf(ChunkLayout layout, int S, int v, int vs) {
  if (S < 1 || v < 1 || vs < 0 || vs >= S * v) return {};
  if (layout == ChunkLayout::kV) {
    if (v == 1) return {vs, 0};
    if (v != 2) return {};
    return vs < S ? StageChunk{vs, 0} : StageChunk{2 * S - 1 - vs, 1};
  }
  return {vs % S, vs / S};
}

int Schedule::VirtualStage(int stage, int chunk) const {
  return VirtualStageOf(layout, num_stages, num_chunks, stage, chunk);
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

}  // namespace trainyard
