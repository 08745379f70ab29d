#include "schedule/schedule_builder.h"

namespace trainyard {

Schedule EmptySchedule(const char* name, int S, int M, bool training) {
  Schedule sched;
  sched.name = name;
  sched.num_stages = S;
  sched.num_microbatches = M;
  sched.training = training;
  sched.stages.resize(S);
  return sched;
}

void AddForward(int vs, int num_virtual, int mb, int chunk,
                std::vector<Action>* out) {
  if (vs > 0) out->push_back({ActionKind::kRecvActivation, mb, chunk});
  out->push_back({ActionKind::kForward, mb, chunk});
  if (vs < num_virtual - 1) {
    out->push_back({ActionKind::kSendActivation, mb, chunk});
  }
}

void AddBackwardInput(int vs, int num_virtual, int mb, int chunk,
                      std::vector<Action>* out) {
  if (vs < num_virtual - 1) {
    out->push_back({ActionKind::kRecvGradient, mb, chunk});
  }
  out->push_back({ActionKind::kBackwardInput, mb, chunk});
  if (vs > 0) out->push_back({ActionKind::kSendGradient, mb, chunk});
}

void AddBackward(int vs, int num_virtual, int mb, int chunk,
                 std::vector<Action>* out) {
  AddBackwardInput(vs, num_virtual, mb, chunk, out);
  out->push_back({ActionKind::kBackwardWeight, mb, chunk});
}

}  // namespace trainyard
