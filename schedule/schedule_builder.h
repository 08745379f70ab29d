// Building blocks the schedule generators share: an empty schedule, and a
// compute pass appended to a stage's action list together with the receive
// before it and the send after it (schedule.h, "Semantics").
#ifndef TRAINYARD_SCHEDULE_SCHEDULE_BUILDER_H_
#define TRAINYARD_SCHEDULE_SCHEDULE_BUILDER_H_

#include <vector>

#include "schedule/schedule.h"

namespace trainyard {

// A schedule named `name` with S stages, M microbatches, one chunk per stage
// and no actions yet.
Schedule EmptySchedule(const char* name, int S, int M, bool training);

// The forward of `mb` on virtual stage `vs` of `num_virtual` (held as
// `chunk` of its stage), with its receive and send.
void AddForward(int vs, int num_virtual, int mb, int chunk,
                std::vector<Action>* out);

// The input-gradient pass with its receive and send, without the weight
// pass.
void AddBackwardInput(int vs, int num_virtual, int mb, int chunk,
                      std::vector<Action>* out);

// The input-gradient pass with its receive and send, then the weight pass.
void AddBackward(int vs, int num_virtual, int mb, int chunk,
                 std::vector<Action>* out);

}  // namespace trainyard

#endif  // TRAINYARD_SCHEDULE_SCHEDULE_BUILDER_H_
