// Pipeline schedules as data.
//
// A Schedule is, per stage, the ordered list of actions that stage runs for
// one optimizer step: forward / backward-input / backward-weight of a
// microbatch, send / receive of an activation or gradient, and the optimizer
// step. Generators build schedules (GPipe, 1F1B, forward-only eval); the
// runner (worker/stage.h) executes any valid schedule without knowing which
// generator made it, so interleaved or zero-bubble schedules are new
// generators, not runner changes.
//
// Semantics the validator checks and the runner relies on:
// - Sends are buffered: a send never waits for its receive. Messages between
//   two neighbours flow through one FIFO channel per direction and kind.
// - A receive blocks until the next message on its channel arrives, and
//   that message must be for the microbatch the receive names.
// - Each stage runs Forward(mb) once, then BackwardInput(mb), then
//   BackwardWeight(mb), for every microbatch, and OptimizerStep last.
// - BackwardWeight runs in ascending microbatch order (gradients accumulate
//   in that order; this is what makes every schedule bitwise equal).
// Both generators run backward in ascending microbatch order so that
// gradients accumulate in the same order under every schedule (the runs are
// bitwise identical across schedules and stage counts).
#ifndef TRAINYARD_CORE_SCHEDULE_H_
#define TRAINYARD_CORE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainyard {

enum class ActionKind {
  kForward,
  kBackwardInput,
  kBackwardWeight,
  kSendActivation,  // to stage + 1
  kRecvActivation,  // from stage - 1
  kSendGradient,    // to stage - 1
  kRecvGradient,    // from stage + 1
  kOptimizerStep,
};

const char* ActionKindName(ActionKind kind);

struct Action {
  ActionKind kind;
  int microbatch = -1;  // -1 for kOptimizerStep
  bool operator==(const Action& o) const {
    return kind == o.kind && microbatch == o.microbatch;
  }
};

std::string ActionToString(const Action& action);  // "F3", "B3", "W3", ...

struct Schedule {
  std::string name;
  int num_stages = 0;
  int num_microbatches = 0;
  bool training = true;  // false: forward only, no optimizer step
  std::vector<std::vector<Action>> stages;  // [num_stages][...]

  // One line per stage, e.g. "stage 0: F0 >A0 F1 >A1 <G0 B0 W0 ...".
  std::string ToString() const;
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
// Forward only (eval / inference).
Schedule MakeForwardOnlySchedule(int num_stages, int num_microbatches);

// "gpipe" | "1f1b" | "zbh1".
absl::StatusOr<Schedule> MakeTrainingSchedule(const std::string& name,
                                              int num_stages,
                                              int num_microbatches);

// Checks the schedule against the semantics above by simulating every
// stage: each forward/backward exactly once and in order, every send matched
// by a receive of the same microbatch, no stage left waiting forever
// (deadlock), nothing left unreceived, the optimizer step last. Returns
// FailedPrecondition naming the stage and action that breaks a rule.
absl::Status ValidateSchedule(const Schedule& schedule);

// The schedule's own pipeline bubble: the share of a step each stage spends
// waiting, averaged over stages, when a forward costs `forward`, an input
// gradient `backward_input` and a weight gradient `backward_weight` time
// units on every stage (messages and the optimizer step cost nothing). With
// an unsplit backward (backward_input 2, backward_weight 0) GPipe and 1F1B
// give the textbook (S-1)/(M+S-1); the defaults (a backward is twice a
// forward, half of it the weight gradient, which runs after the gradient is
// sent on) give less. FailedPrecondition for a schedule that deadlocks.
absl::StatusOr<double> SimulatedBubble(const Schedule& schedule,
                                       double forward = 1,
                                       double backward_input = 1,
                                       double backward_weight = 1);

}  // namespace trainyard

#endif  // TRAINYARD_CORE_SCHEDULE_H_
