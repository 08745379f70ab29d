// JobEventLog: one job's append-only, in-memory event history (state
// changes, StepMetrics, EvalMetrics) with change notification, the heart of
// the WatchJob fan-out.
//
// Every watcher reads the log with its own cursor and is told (through its
// Listener) when events are appended; nothing is copied per watcher and
// nothing is ever dropped, so a slow or vanished watcher costs only its
// cursor and never stalls the writer or the other watchers.
//
// Ownership: shared (std::shared_ptr) by the JobManager and every watcher of
// the job. Listeners are held by weak_ptr: a listener that is destroyed
// simply stops being notified.
//
// Thread safety: all methods are thread-safe. Listeners are called without
// the log's lock held, so OnJobEvents may call back into the log.
#ifndef TRAINYARD_CONTROLLER_JOB_EVENT_LOG_H_
#define TRAINYARD_CONTROLLER_JOB_EVENT_LOG_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "controller/weak_listeners.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

bool IsTerminal(v1::JobState state);

class JobEventLog {
 public:
  class Listener {
   public:
    virtual ~Listener() = default;
    // New events were appended (possibly several). Called on the
    // appender's thread; must not block.
    virtual void OnJobEvents() = 0;
  };

  // `history` is the job's event list so far (e.g. loaded from the store);
  // the current state is that of its last state-change event.
  explicit JobEventLog(std::vector<v1::JobEvent> history);

  // Appends `event`, returns its sequence number (its index), and notifies
  // the listeners. A state-change event updates the current state.
  int64_t Append(v1::JobEvent event);

  // The sequence number the next Append will return.
  int64_t size() const;

  struct Snapshot {
    v1::JobStateChange state;  // the current state
    int64_t size = 0;          // events appended so far
  };
  // Registers `listener` and returns the current state and size as one
  // atomic snapshot: every event at index >= size will be notified.
  Snapshot Subscribe(std::weak_ptr<Listener> listener);

  // Copies event `index` to *out; false when index >= size().
  bool Read(int64_t index, v1::JobEvent* out) const;

 private:
  void Notify();

  mutable absl::Mutex mu_;
  std::vector<v1::JobEvent> events_ ABSL_GUARDED_BY(mu_);
  v1::JobStateChange state_ ABSL_GUARDED_BY(mu_);
  WeakListeners<Listener> listeners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_JOB_EVENT_LOG_H_
