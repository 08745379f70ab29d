#include "schedule/schedule.h"

#include <algorithm>
#include <array>
#include <climits>
#include <deque>
#include <limits>
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
  if (a.chunk == 0) return absl::StrCat(prefix, a.microbatch);
  return absl::StrCat(prefix, a.microbatch, ".", a.chunk);
}

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

namespace {

// The forward of `mb` on virtual stage `vs` of `num_virtual` (held as
// `chunk` of its stage), with its receive and send.
void AddForward(int vs, int num_virtual, int mb, int chunk,
                std::vector<Action>* out) {
  if (vs > 0) out->push_back({ActionKind::kRecvActivation, mb, chunk});
  out->push_back({ActionKind::kForward, mb, chunk});
  if (vs < num_virtual - 1) {
    out->push_back({ActionKind::kSendActivation, mb, chunk});
  }
}

// The input-gradient pass with its receive and send, without the weight
// pass.
void AddBackwardInput(int vs, int num_virtual, int mb, int chunk,
                      std::vector<Action>* out) {
  if (vs < num_virtual - 1) {
    out->push_back({ActionKind::kRecvGradient, mb, chunk});
  }
  out->push_back({ActionKind::kBackwardInput, mb, chunk});
  if (vs > 0) out->push_back({ActionKind::kSendGradient, mb, chunk});
}

void AddForward(int s, int S, int mb, std::vector<Action>* out) {
  AddForward(s, S, mb, 0, out);
}

void AddBackward(int vs, int num_virtual, int mb, int chunk,
                 std::vector<Action>* out) {
  AddBackwardInput(vs, num_virtual, mb, chunk, out);
  out->push_back({ActionKind::kBackwardWeight, mb, chunk});
}

void AddBackward(int s, int S, int mb, std::vector<Action>* out) {
  AddBackward(s, S, mb, 0, out);
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

// One run of the ZB-V list scheduler (messages are free; a chunk pass
// costs half of `costs`' whole-stage pass). Whenever a stage is free it
// starts at most one pass, preferring a ready input-gradient pass (chunk 1
// first), then a ready forward its memory allows (chunk 1 first), then its
// oldest pending weight pass; with nothing ready it waits for the next
// arrival. A stage holds a (microbatch, chunk) activation from its forward
// to its weight pass; a chunk-1 forward needs fewer than 2S held, a chunk-0
// forward (which lets a new microbatch into the stage) fewer than
// clamp(S + s + cap_shift, 1, 2S). Free stages at the same moment decide in
// stage order. Fills `passes` (F/B/W per stage, in order) and the makespan;
// false when the run stalls.
bool ListScheduleV(int S, int M, int cap_shift, const PassCosts& costs,
                   std::vector<std::vector<Action>>* passes, double* makespan) {
  const int V = 2 * S;
  const double kNever = std::numeric_limits<double>::infinity();
  const double cost_f = costs.forward / 2, cost_b = costs.backward_input / 2,
               cost_w = costs.backward_weight / 2;
  // When the activation (gradient) of each microbatch reaches virtual stage
  // vs from vs - 1 (vs + 1).
  std::vector<std::vector<double>> act_ready(V, std::vector<double>(M, kNever));
  std::vector<std::vector<double>> grad_ready(V,
                                              std::vector<double>(M, kNever));
  std::fill(act_ready[0].begin(), act_ready[0].end(), 0.0);
  struct StageState {
    std::array<int, 2> next_f{0, 0}, next_b{0, 0}, next_w{0, 0};
    int held = 0;
    double free_at = 0;
    int done = 0;
  };
  std::vector<StageState> st(S);
  passes->assign(S, {});
  *makespan = 0;
  const int per_stage = 6 * M;
  int remaining = per_stage * S;
  while (remaining > 0) {
    // The next moment a stage with work left is free; every such stage
    // decides then, in stage order (outputs arrive later: costs are > 0).
    double t = kNever;
    for (const StageState& x : st) {
      if (x.done < per_stage) t = std::min(t, x.free_at);
    }
    std::vector<int> blocked;
    for (int s = 0; s < S; ++s) {
      StageState& x = st[s];
      if (x.done == per_stage || x.free_at != t) continue;
      const int cap0 = std::clamp(S + s + cap_shift, 1, V);
      const int vs[2] = {s, V - 1 - s};
      Action pick{ActionKind::kOptimizerStep, -1, 0};
      for (int c : {1, 0}) {
        const int mb = x.next_b[c];
        if (mb < x.next_f[c] &&
            (vs[c] == V - 1 || grad_ready[vs[c]][mb] <= t)) {
          pick = {ActionKind::kBackwardInput, mb, c};
          break;
        }
      }
      if (pick.microbatch < 0) {
        for (int c : {1, 0}) {
          const int mb = x.next_f[c];
          if (mb < M && act_ready[vs[c]][mb] <= t &&
              x.held < (c == 1 ? V : cap0)) {
            pick = {ActionKind::kForward, mb, c};
            break;
          }
        }
      }
      if (pick.microbatch < 0) {
        for (int c : {1, 0}) {
          if (x.next_w[c] < x.next_b[c]) {
            pick = {ActionKind::kBackwardWeight, x.next_w[c], c};
            break;
          }
        }
      }
      if (pick.microbatch < 0) {
        blocked.push_back(s);
        continue;
      }
      const int c = pick.chunk;
      const int mb = pick.microbatch;
      double end = t;
      switch (pick.kind) {
        case ActionKind::kForward:
          end = t + cost_f;
          ++x.next_f[c];
          ++x.held;
          if (vs[c] < V - 1) act_ready[vs[c] + 1][mb] = end;
          break;
        case ActionKind::kBackwardInput:
          end = t + cost_b;
          ++x.next_b[c];
          if (vs[c] > 0) grad_ready[vs[c] - 1][mb] = end;
          break;
        default:
          end = t + cost_w;
          ++x.next_w[c];
          --x.held;
          break;
      }
      x.free_at = end;
      ++x.done;
      (*passes)[s].push_back(pick);
      *makespan = std::max(*makespan, end);
      --remaining;
    }
    if (blocked.empty()) continue;
    // A blocked stage waits for the next moment anything changes: the next
    // end of a running pass (every arrival is one).
    double next = kNever;
    for (const StageState& x : st) {
      if (x.done < per_stage && x.free_at > t) next = std::min(next, x.free_at);
    }
    for (int k = 0; k < S; ++k) {
      // A stage that finished all its passes may still be running its last.
      if (st[k].done == per_stage && st[k].free_at > t) {
        next = std::min(next, st[k].free_at);
      }
    }
    if (next == kNever) return false;  // everyone waits: stalled
    for (int s : blocked) st[s].free_at = next;
  }
  return true;
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
  // A list scheduler in unit time (F = B = W = 1, free messages): at each
  // tick each stage starts at most one pass, preferring a ready input
  // gradient (it unblocks the stage before), then a forward if it has
  // fewer than S - s microbatches between forward and input gradient (1F1B's
  // warm-up) and fewer than 2S - s - 1 whose weight pass is still pending,
  // then its oldest pending weight pass. So weight passes move into what
  // would be idle time, and the steady state stays 1F1B's. At F = B = W
  // this reaches the zero-bubble paper's ZB-H1 step, 3M + S - 1, idle
  // (S - 1) per stage (tested); weight passes stay in ascending order.
  Schedule sched = Empty("zbh1", S, M, true);
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
        AddForward(s, S, f, &acts);
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
  Schedule sched = Empty("interleaved", S, M, true);
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

absl::StatusOr<Schedule> MakeZeroBubbleVSchedule(int S, int M,
                                                 const PassCosts& costs) {
  if (S < 1 || M < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule zbv: needs >= 1 stage and microbatch, got ", S, " and ", M));
  }
  // Try warm-up caps around S + s, nearest first; keep the shortest step.
  // At most 17 tries, so that the largest schedules a spec allows are built
  // in seconds (each try is a whole list-scheduling run).
  std::vector<std::vector<Action>> best;
  double best_makespan = std::numeric_limits<double>::infinity();
  for (int i = 0; i <= std::min(2 * S, 16); ++i) {
    const int shift = (i % 2 == 0) ? -(i / 2) : (i + 1) / 2;  // 0,1,-1,...
    std::vector<std::vector<Action>> passes;
    double makespan = 0;
    if (!ListScheduleV(S, M, shift, costs, &passes, &makespan)) continue;
    if (makespan < best_makespan) {
      best_makespan = makespan;
      best = std::move(passes);
    }
  }
  if (best.empty()) {
    return absl::InternalError(absl::StrCat(
        "schedule zbv: the list scheduler stalled for every warm-up cap (S=", S,
        ", M=", M, ")"));
  }
  Schedule sched = Empty("zbv", S, M, true);
  sched.num_chunks = 2;
  sched.layout = ChunkLayout::kV;
  const int V = 2 * S;
  for (int s = 0; s < S; ++s) {
    auto& acts = sched.stages[s];
    for (const Action& p : best[s]) {
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

Schedule MakeForwardOnlySchedule(int S, int M, int v, ChunkLayout layout) {
  Schedule sched = Empty("forward", S, M, false);
  sched.num_chunks = v;
  sched.layout = layout;
  const int V = S * v;
  for (int mb = 0; mb < M; ++mb) {
    for (int vs = 0; vs < V; ++vs) {
      const StageChunk at = StageChunkOf(layout, S, v, vs);
      AddForward(vs, V, mb, at.chunk, &sched.stages[at.stage]);
    }
  }
  return sched;
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

absl::Status ValidateSchedule(const Schedule& sched) {
  const int S = sched.num_stages;
  const int M = sched.num_microbatches;
  const int v = sched.num_chunks;
  auto fail = [&](int s, const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("schedule ", sched.name, ": stage ", s, ": ", why));
  };
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
  const int V = sched.num_virtual_stages();
  const bool chunked = v > 1;
  const char* unit = chunked ? "virtual stage" : "stage";
  std::vector<int> stage_of(V);
  for (int s = 0; s < S; ++s) {
    for (int c = 0; c < v; ++c) stage_of[sched.VirtualStage(s, c)] = s;
  }
  // Per (stage, chunk) ordering rules.
  for (int s = 0; s < S; ++s) {
    auto per_chunk = [&] {
      return std::vector<std::vector<int>>(v, std::vector<int>(M, 0));
    };
    auto fwd = per_chunk(), bin = per_chunk(), bw = per_chunk();
    auto recv_act = per_chunk(), sent_act = per_chunk(),
         recv_grad = per_chunk(), sent_grad = per_chunk();
    std::vector<int> next_weight(v, 0);
    int next_loss = 0;  // the last virtual stage's next forward
    int optimizer_steps = 0;
    for (const Action& a : sched.stages[s]) {
      const std::string what = ActionToString(a);
      if (optimizer_steps > 0) return fail(s, what + " after optimizer-step");
      if (a.kind == ActionKind::kOptimizerStep) {
        if (!sched.training) return fail(s, "optimizer-step in forward-only");
        ++optimizer_steps;
        continue;
      }
      if (a.chunk < 0 || a.chunk >= v) {
        return fail(s, absl::StrCat(what, ": chunk out of range [0, ", v, ")"));
      }
      if (a.microbatch < 0 || a.microbatch >= M) {
        return fail(
            s, absl::StrCat(what, ": microbatch out of range [0, ", M, ")"));
      }
      const int mb = a.microbatch;
      const int c = a.chunk;
      const int vs = sched.VirtualStage(s, c);
      const bool first = vs == 0;
      const bool last = vs == V - 1;
      switch (a.kind) {
        case ActionKind::kRecvActivation:
          if (first) {
            return fail(s,
                        absl::StrCat(what, ": first ", unit, " has no sender"));
          }
          if (recv_act[c][mb]++) return fail(s, what + " twice");
          break;
        case ActionKind::kForward:
          if (!first && !recv_act[c][mb]) return fail(s, what + " before <A");
          if (fwd[c][mb]++) return fail(s, what + " twice");
          // The loss head sums its terms in the order of these forwards.
          if (last && mb != next_loss++) {
            return fail(s, absl::StrCat(what, ": the last ", unit,
                                        " must run its forwards (the loss) in "
                                        "ascending microbatch order, expected "
                                        "microbatch ",
                                        next_loss - 1));
          }
          break;
        case ActionKind::kSendActivation:
          if (last) {
            return fail(
                s, absl::StrCat(what, ": last ", unit, " has no receiver"));
          }
          if (!fwd[c][mb]) return fail(s, what + " before its forward");
          if (sent_act[c][mb]++) return fail(s, what + " twice");
          break;
        case ActionKind::kRecvGradient:
          if (!sched.training) return fail(s, what + " in forward-only");
          if (last) {
            return fail(s,
                        absl::StrCat(what, ": last ", unit, " has no sender"));
          }
          if (recv_grad[c][mb]++) return fail(s, what + " twice");
          break;
        case ActionKind::kBackwardInput:
          if (!sched.training) return fail(s, what + " in forward-only");
          if (!fwd[c][mb]) return fail(s, what + " before its forward");
          if (!last && !recv_grad[c][mb]) return fail(s, what + " before <G");
          if (bin[c][mb]++) return fail(s, what + " twice");
          break;
        case ActionKind::kSendGradient:
          if (first) {
            return fail(
                s, absl::StrCat(what, ": first ", unit, " has no receiver"));
          }
          if (!bin[c][mb]) return fail(s, what + " before its backward-input");
          if (sent_grad[c][mb]++) return fail(s, what + " twice");
          break;
        case ActionKind::kBackwardWeight:
          if (!bin[c][mb]) return fail(s, what + " before its backward-input");
          if (bw[c][mb]++) return fail(s, what + " twice");
          // Gradients accumulate in this order; ascending order under every
          // schedule is what keeps results bitwise equal across schedules.
          if (mb != next_weight[c]) {
            return fail(s, ActionToString(a) +
                               ": weight gradients must run in ascending "
                               "microbatch order, expected " +
                               ActionToString({ActionKind::kBackwardWeight,
                                               next_weight[c], c}));
          }
          ++next_weight[c];
          break;
        case ActionKind::kOptimizerStep:
          break;
      }
    }
    for (int c = 0; c < v; ++c) {
      const int vs = sched.VirtualStage(s, c);
      for (int mb = 0; mb < M; ++mb) {
        const std::string m =
            absl::StrCat(" of microbatch ", mb,
                         chunked ? absl::StrCat(", chunk ", c) : std::string());
        if (!fwd[c][mb]) return fail(s, "no forward" + m);
        if (vs < V - 1 && !sent_act[c][mb]) {
          return fail(s, "no send-activation" + m);
        }
        if (sched.training) {
          if (!bin[c][mb]) return fail(s, "no backward-input" + m);
          if (!bw[c][mb]) return fail(s, "no backward-weight" + m);
          if (vs > 0 && !sent_grad[c][mb]) {
            return fail(s, "no send-gradient" + m);
          }
        }
      }
    }
    if (sched.training && optimizer_steps != 1) {
      return fail(s, "needs exactly one optimizer-step at the end");
    }
  }

  // Simulate: buffered sends, blocking FIFO receives. act[vs]: activations
  // in flight from virtual stage vs to vs+1; grad[vs]: from vs+1 to vs.
  std::vector<std::deque<int>> act(V), grad(V);
  std::vector<size_t> pc(S, 0);
  while (true) {
    bool progressed = false;
    bool done = true;
    for (int s = 0; s < S; ++s) {
      const auto& acts = sched.stages[s];
      while (pc[s] < acts.size()) {
        const Action& a = acts[pc[s]];
        const int vs = sched.VirtualStage(s, a.chunk);
        std::deque<int>* in = nullptr;
        if (a.kind == ActionKind::kRecvActivation) in = &act[vs - 1];
        if (a.kind == ActionKind::kRecvGradient) in = &grad[vs];
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
        if (a.kind == ActionKind::kSendActivation) {
          act[vs].push_back(a.microbatch);
        }
        if (a.kind == ActionKind::kSendGradient) {
          grad[vs - 1].push_back(a.microbatch);
        }
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
  for (int vs = 0; vs < V; ++vs) {
    if (!act[vs].empty() || !grad[vs].empty()) {
      return fail(stage_of[vs], "messages sent but never received");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ScheduleSimulation> SimulateSchedule(const Schedule& sched,
                                                    const PassCosts& costs) {
  const int S = sched.num_stages;
  const int v = sched.num_chunks;
  if (S < 1 || v < 1 || static_cast<int>(sched.stages.size()) != S) {
    return absl::FailedPreconditionError(
        absl::StrCat("schedule ", sched.name, ": has ", sched.stages.size(),
                     " stage lists for ", S, " stages and ", v, " chunks"));
  }
  const int V = sched.num_virtual_stages();
  // When each message is available: [sender virtual stage][kind: 0
  // activation, 1 gradient] -> per microbatch.
  std::vector<std::array<std::map<int, double>, 2>> sent(V);
  std::vector<size_t> next(S, 0);
  std::vector<double> clock(S, 0);
  std::vector<int> held(S, 0);
  ScheduleSimulation sim;
  sim.busy.assign(S, 0);
  sim.peak_chunk_activations.assign(S, 0);
  sim.timeline.resize(S);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < S; ++s) {
      while (next[s] < sched.stages[s].size()) {
        const Action& a = sched.stages[s][next[s]];
        const int vs = sched.VirtualStage(s, a.chunk);
        if (vs < 0 && a.kind != ActionKind::kOptimizerStep) {
          return absl::FailedPreconditionError(absl::StrCat(
              "schedule ", sched.name, ": stage ", s, ": ", ActionToString(a),
              ": chunk out of range [0, ", v, ")"));
        }
        double cost = 0;
        switch (a.kind) {
          case ActionKind::kForward:
            cost = costs.forward / v;
            // An eval forward keeps nothing for a backward.
            if (sched.training) {
              sim.peak_chunk_activations[s] =
                  std::max(sim.peak_chunk_activations[s], ++held[s]);
            }
            break;
          case ActionKind::kBackwardInput:
            cost = costs.backward_input / v;
            break;
          case ActionKind::kBackwardWeight:
            cost = costs.backward_weight / v;
            --held[s];
            break;
          case ActionKind::kSendActivation:
            sent[vs][0][a.microbatch] = clock[s];
            break;
          case ActionKind::kSendGradient:
            sent[vs][1][a.microbatch] = clock[s];
            break;
          case ActionKind::kRecvActivation:
          case ActionKind::kRecvGradient: {
            const bool act = a.kind == ActionKind::kRecvActivation;
            const int from = act ? vs - 1 : vs + 1;
            if (from < 0 || from >= V) {
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
        if (a.kind == ActionKind::kForward ||
            a.kind == ActionKind::kBackwardInput ||
            a.kind == ActionKind::kBackwardWeight) {
          sim.timeline[s].push_back({a, clock[s], clock[s] + cost});
        }
        clock[s] += cost;
        sim.busy[s] += cost;
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
  sim.makespan = *std::max_element(clock.begin(), clock.end());
  double idle_sum = 0, busy_sum = 0;
  for (int s = 0; s < S; ++s) {
    sim.idle.push_back(sim.makespan - sim.busy[s]);
    sim.peak_in_flight.push_back(
        static_cast<double>(sim.peak_chunk_activations[s]) / v);
    idle_sum += sim.idle[s];
    busy_sum += sim.busy[s];
    if (sim.makespan > 0) sim.bubble += sim.idle[s] / sim.makespan / S;
  }
  if (busy_sum > 0) sim.bubble_of_compute = idle_sum / busy_sum;
  return sim;
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
