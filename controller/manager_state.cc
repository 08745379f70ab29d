#include "controller/manager_state.h"

#include <utility>

namespace trainyard {

void SendRendezvousRepliesLocked(ManagerState& s,
                                 std::vector<RendezvousTable::Reply> replies) {
  for (RendezvousTable::Reply& r : replies) {
    auto it = s.workers.find(r.worker_id);
    if (it == s.workers.end()) continue;  // lost; its stream is closed
    v1::ControllerMessage msg;
    *msg.mutable_rendezvous_reply() = std::move(r.reply);
    s.outbox.SendLocked(it->second.link, std::move(msg));
  }
}

}  // namespace trainyard
