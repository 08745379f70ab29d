// The forward-only schedule (eval and inference) for any chunk layout.
#include "schedule/schedule.h"
#include "schedule/schedule_builder.h"

namespace trainyard {

Schedule MakeForwardOnlySchedule(int S, int M, int v, ChunkLayout layout) {
  Schedule sched = EmptySchedule("forward", S, M, false);
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

}  // namespace trainyard
