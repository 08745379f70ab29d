// WeakListeners: the listeners of a JobEventLog or LogRing, held by
// weak_ptr, so a listener (a stream reactor) that goes away needs no
// unsubscribe: it is dropped at the next Live().
//
// Not thread-safe: the owner guards it with its own mutex, takes Live()
// under that mutex and calls the listeners after releasing it.
#ifndef TRAINYARD_CONTROLLER_WEAK_LISTENERS_H_
#define TRAINYARD_CONTROLLER_WEAK_LISTENERS_H_

#include <memory>
#include <utility>
#include <vector>

namespace trainyard {

template <typename L>
class WeakListeners {
 public:
  void Add(std::weak_ptr<L> listener) {
    listeners_.push_back(std::move(listener));
  }

  // The listeners still alive; forgets the others.
  std::vector<std::shared_ptr<L>> Live() {
    std::vector<std::shared_ptr<L>> live;
    std::vector<std::weak_ptr<L>> kept;
    kept.reserve(listeners_.size());
    for (auto& weak : listeners_) {
      if (auto l = weak.lock()) {
        live.push_back(std::move(l));
        kept.push_back(std::move(weak));
      }
    }
    listeners_ = std::move(kept);
    return live;
  }

 private:
  std::vector<std::weak_ptr<L>> listeners_;
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_WEAK_LISTENERS_H_
