// Pipeline schedules as data.
//
// A Schedule is, per stage, the ordered list of actions that stage runs for
// one optimizer step: forward / backward-input / backward-weight of a
// microbatch on one of the stage's model chunks, send / receive of an
// activation or gradient, and the optimizer step. Generators build schedules
// (GPipe, 1F1B, ZB-H1, interleaved 1F1B, ZB-V, forward-only eval); the runner
// (engine/stage.h) executes any valid schedule without knowing which
// generator made it. docs/SCHEDULES.md shows each schedule and its bubble.
//
// Chunks. A stage may hold several model chunks (num_chunks = v): the model
// is cut into S * v virtual stages, and stage s holds v of them. The layout
// says which:
// - kLoop (interleaved 1F1B): chunk c of stage s is virtual stage c * S + s,
//   so chunk c on the last stage feeds chunk c + 1 on stage 0.
// - kV (ZB-V, v = 2): chunk 0 of stage s is virtual stage s and chunk 1 is
//   2S - 1 - s: the model runs down the stages and back up, and the loss is
//   computed on stage 0's chunk 1.
// With one chunk both layouts are the plain pipeline: virtual stage = stage.
// Virtual stage 0 (the data) is always on stage 0; the last virtual stage
// (the loss) is on stage S - 1 under kLoop and on stage 0 under kV.
//
// Semantics the validator checks and the runner relies on:
// - Sends are buffered: a send never waits for its receive. Messages flow
//   through one FIFO channel per (sender virtual stage, receiver virtual
//   stage, kind); a hand-off between two chunks of the same stage (the tip
//   of the V) is a send and a receive like any other.
// - A receive blocks until the next message on its channel arrives, and
//   that message must be for the microbatch the receive names.
// - Each (stage, chunk) runs Forward(mb) once, then BackwardInput(mb), then
//   BackwardWeight(mb), for every microbatch, and OptimizerStep last.
// - The last virtual stage runs its forwards in ascending microbatch order:
//   the loss terms are summed in that order.
// - BackwardWeight runs in ascending microbatch order on each (stage, chunk):
//   a parameter's gradients accumulate in that order under every schedule,
//   chunk count and stage split, which is what makes them bitwise equal.
#ifndef TRAINYARD_SCHEDULE_SCHEDULE_H_
#define TRAINYARD_SCHEDULE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainyard {

enum class ActionKind {
  kForward,
  kBackwardInput,
  kBackwardWeight,
  kSendActivation,  // to virtual stage + 1
  kRecvActivation,  // from virtual stage - 1
  kSendGradient,    // to virtual stage - 1
  kRecvGradient,    // from virtual stage + 1
  kOptimizerStep,
};

const char* ActionKindName(ActionKind kind);

// Forward, backward-input and backward-weight: the passes that compute (the
// other actions move messages or step the optimizer).
bool IsComputePass(ActionKind kind);

struct Action {
  ActionKind kind;
  int microbatch = -1;  // -1 for kOptimizerStep
  int chunk = 0;        // which of the stage's model chunks; 0 for OPT
  bool operator==(const Action& o) const {
    return kind == o.kind && microbatch == o.microbatch && chunk == o.chunk;
  }
};

// "F3", "B3", "W3", ">A3", "<A3", ">G3", "<G3", "OPT" for chunk 0, and the
// chunk after a dot otherwise: "F3.1" is the forward of microbatch 3 on
// chunk 1 ("F3" is "F3.0", so single-chunk schedules carry no suffix).
std::string ActionToString(const Action& action);

enum class ChunkLayout {
  kLoop,  // virtual stage of (s, c) = c * S + s
  kV,     // 2 chunks: (s, 0) = s, (s, 1) = 2S - 1 - s
};

// How a schedule lays out its chunks: kV for "zbv", kLoop for the rest.
ChunkLayout ChunkLayoutOf(const std::string& schedule_name);

// The virtual stage that chunk `chunk` of stage `stage` holds, with S
// stages of v chunks each; -1 when either is out of range (or the layout is
// kV and v is neither 1 nor 2).
int VirtualStageOf(ChunkLayout layout, int num_stages, int num_chunks,
                   int stage, int chunk);
// The inverse: the (stage, chunk) holding virtual stage `virtual_stage`;
// {-1, -1} when it is out of range.
struct StageChunk {
  int stage = -1;
  int chunk = -1;
};
StageChunk StageChunkOf(ChunkLayout layout, int num_stages, int num_chunks,
                        int virtual_stage);

struct Schedule {
  std::string name;
  int num_stages = 0;
  int num_microbatches = 0;
  int num_chunks = 1;  // model chunks per stage (v)
  ChunkLayout layout = ChunkLayout::kLoop;
  bool training = true;  // false: forward only, no optimizer step
  std::vector<std::vector<Action>> stages;  // [num_stages][...]

  int num_virtual_stages() const { return num_stages * num_chunks; }
  // The virtual stage (stage, chunk) holds; -1 when either is out of range
  // (or the layout is kV and num_chunks is not 2).
  int VirtualStage(int stage, int chunk) const;

  // One line per stage, e.g. "stage 0: F0 >A0 F1 >A1 <G0 B0 W0 ...".
  std::string ToString() const;
};

// Time units a whole stage spends on one microbatch's forward, input
// gradient and weight gradient. A pass on one of v chunks costs 1/v of
// that, so totals compare fairly across chunk counts. Messages and the
// optimizer step cost nothing.
struct PassCosts {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
};

// GPipe: all forwards, then all backwards (ascending microbatch order).
Schedule MakeGPipeSchedule(int num_stages, int num_microbatches);
// 1F1B (PipeDream-Flush): stage s warms up with min(S-s-1, M) forwards, then
// alternates one forward and one backward, then drains.
Schedule MakeOneFOneBSchedule(int num_stages, int num_microbatches);
// Zero-bubble H1 style: 1F1B whose stage s defers the weight-gradient
// passes of its last min(S-s-1, M) microbatches to the end of the step, so
// its input gradients reach the stage before it sooner and the cooldown
// bubble shrinks (Megatron's backward_dw split is what makes this possible).
// Weight gradients still accumulate in ascending microbatch order.
Schedule MakeZeroBubbleH1Schedule(int num_stages, int num_microbatches);
// Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021), layout kLoop with
// `num_chunks` chunks per stage. Microbatches go through in groups of S:
// a stage runs the forwards of one group on chunk 0, then on chunk 1, ...;
// stage s warms up with 2(S-s-1) + (v-1)S chunk forwards, then alternates
// one chunk forward and one chunk backward (backwards visit the chunks in
// reverse), then drains; each backward-input is followed by its weight pass.
// InvalidArgument unless S, M >= 1, num_chunks >= 2 and M is a multiple of S.
absl::StatusOr<Schedule> MakeInterleavedSchedule(int num_stages,
                                                 int num_microbatches,
                                                 int num_chunks);
// ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", the V
// schedule of zero-bubble pipeline parallelism): layout kV, two chunks per
// stage, backward split into input- and weight-gradient passes. The order is
// the one a list scheduler finds for `costs` (unit costs by default, as in
// the paper; a chunk pass costs half a whole stage's): a free stage runs a
// ready input-gradient pass first, else a ready forward while the stage holds
// fewer than 2S chunk activations (S whole microbatches: 1F1B's peak) and,
// for a chunk-0 forward, fewer than a warm-up cap of about S + s, else its
// oldest pending weight pass. Of the caps S + s + k, |k| <= min(S, 8), the
// generator keeps the one with the shortest step (k = 0 when M is a multiple
// of S). Weight passes run in ascending microbatch order on each chunk.
// InvalidArgument unless S, M >= 1.
absl::StatusOr<Schedule> MakeZeroBubbleVSchedule(
    int num_stages, int num_microbatches, const PassCosts& costs = PassCosts());
// Forward only (eval / inference), for a model cut into num_stages *
// num_chunks virtual stages laid out as `layout`: every stage runs its
// (microbatch, chunk) forwards in ascending (microbatch, virtual stage)
// order, which never deadlocks (the smallest pair not yet done can always
// run).
Schedule MakeForwardOnlySchedule(int num_stages, int num_microbatches,
                                 int num_chunks = 1,
                                 ChunkLayout layout = ChunkLayout::kLoop);

// The schedule a job's spec names: "gpipe" | "1f1b" | "zbh1" (num_chunks 1)
// | "interleaved" (num_chunks >= 2) | "zbv" (num_chunks 2). num_chunks 0
// picks the schedule's default (DefaultChunks). `costs` shapes only zbv's
// order. InvalidArgument for an unknown name or a chunk count the schedule
// does not take.
absl::StatusOr<Schedule> MakeTrainingSchedule(
    const std::string& name, int num_stages, int num_microbatches,
    int num_chunks = 0, const PassCosts& costs = PassCosts());
// The chunks per stage a schedule takes when none are asked for: 2 for
// "interleaved" and "zbv", else 1.
int DefaultChunks(const std::string& schedule_name);

// The most (microbatch, chunk) activations stage `stage` holds at once (as
// SimulateSchedule counts them: from the start of a forward to the end of
// its weight pass) under the named training schedule with S stages, M
// microbatches and v chunks per stage:
//   gpipe M; 1f1b min(M, S - s); zbh1 min(M, 2S - s - 1);
//   interleaved min(v M, 2(S - s - 1) + (v - 1) S + 1); zbv min(2M, 2S).
// A bound the generators keep under any costs, reached with unit costs
// (schedule_test checks both). The planner's memory estimate counts it
// (plan/memory_estimate.cc).
int PeakChunkActivations(const std::string& schedule_name, int num_stages,
                         int num_microbatches, int num_chunks, int stage);

// Checks the schedule against the semantics above by simulating every
// stage: each forward/backward exactly once per (stage, chunk) and in order,
// every send matched by a receive of the same microbatch, no stage left
// waiting forever (deadlock), nothing left unreceived, the optimizer step
// last. Returns FailedPrecondition naming the stage and action that breaks a
// rule.
absl::Status ValidateSchedule(const Schedule& schedule);

// One compute pass (F, B or W) placed in time by SimulateSchedule.
struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
};

// What a schedule does in time under given costs. Every stage's step ends at
// the makespan, so its idle time is makespan - busy (waiting for a message
// and the drain at the end alike).
struct ScheduleSimulation {
  double makespan = 0;
  std::vector<double> busy;  // [stage] time spent in F, B and W passes
  std::vector<double> idle;  // [stage] makespan - busy
  // The share of the step spent idle: mean over stages of
  // idle / (idle + busy) = idle / makespan. (S-1)/(M+S-1) for GPipe and
  // 1F1B with an unsplit backward.
  double bubble = 0;
  // The bubble as a share of compute, as the zero-bubble and Megatron papers
  // often quote it: sum of idle / sum of busy ((S-1)/M for 1F1B unsplit).
  double bubble_of_compute = 0;
  // [stage] most (microbatch, chunk) activations held at once: counted from
  // the start of a forward to the end of its weight pass (the last pass that
  // reads the saved tensors).
  std::vector<int> peak_chunk_activations;
  // [stage] the same in whole-stage microbatches: peak_chunk_activations /
  // num_chunks (a chunk's activations are 1/v of a stage's). 1F1B: S - s.
  std::vector<double> peak_in_flight;
  std::vector<std::vector<TimedAction>> timeline;  // [stage] F/B/W in order
};

// Runs the schedule with buffered sends and blocking receives, each pass
// starting as soon as its stage is free and its message has arrived.
// FailedPrecondition for a schedule that deadlocks or receives from no one.
absl::StatusOr<ScheduleSimulation> SimulateSchedule(
    const Schedule& schedule, const PassCosts& costs = PassCosts());

// SimulateSchedule(...).bubble. With an unsplit backward (backward_input 2,
// backward_weight 0) GPipe and 1F1B give the textbook (S-1)/(M+S-1); the
// defaults (a backward is twice a forward, half of it the weight gradient,
// which runs after the gradient is sent on) give less.
absl::StatusOr<double> SimulatedBubble(const Schedule& schedule,
                                       double forward = 1,
                                       double backward_input = 1,
                                       double backward_weight = 1);

}  // namespace trainyard

#endif  // TRAINYARD_SCHEDULE_SCHEDULE_H_
