// JobEventLog: one job's append-only event history (state changes,
// StepMetrics, EvalMetrics, notes) with change notification, the heart of
// the WatchJob fan-out.
//
// Every event is stored (controller/job_store.h) and numbered by its
// sequence number there. The newest `max_in_memory` are also held here; a
// reader behind them (a watcher replaying a long job, or one too slow to
// keep up) gets the older ones from the store, so a job's history costs
// the controller's memory at most that many events, however long it runs.
//
// Every watcher reads the log with its own cursor and is told (through its
// Listener) when events are appended; nothing is copied per watcher and
// nothing is dropped, so a slow or vanished watcher costs only its cursor
// and never stalls the writer or the other watchers.
//
// Ownership: shared (std::shared_ptr) by the JobManager and every watcher of
// the job. Listeners are held by weak_ptr: a listener that is destroyed
// simply stops being notified.
//
// Thread safety: all methods are thread-safe. Listeners are called without
// the log's lock held, so OnJobEvents may call back into the log. The
// store is read without the log's lock held.
#ifndef TRAINYARD_CONTROLLER_JOB_EVENT_LOG_H_
#define TRAINYARD_CONTROLLER_JOB_EVENT_LOG_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

  // How many events a reader asks Read for at a time: one store query
  // per this many events of old history.
  static constexpr int64_t kEventsPerRead = 1024;

  // Reads events `from` .. `from + count - 1` of the job from the store,
  // as JobStore::LoadEvents: element i is event from + i, empty when it is
  // missing there.
  using StoredEvents = std::function<absl::StatusOr<std::vector<v1::JobEvent>>(
      int64_t from, int64_t count)>;

  // A log whose events `first` .. `first + tail.size() - 1` are `tail`
  // (the newest stored), whose older events are read through `stored`,
  // and whose current state is `state`. Holds at most `max_in_memory`
  // events (at least 1).
  JobEventLog(int64_t first, std::vector<v1::JobEvent> tail,
              v1::JobStateChange state, int64_t max_in_memory,
              StoredEvents stored);

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

  // Appends events `from` .. `from + max - 1` to *out, fewer where the log
  // ends (none at or past size()). An event missing from the store (its
  // write failed) is an empty JobEvent. An error, naming the job's events,
  // only when the store cannot be read.
  absl::Status Read(int64_t from, int64_t max,
                    std::vector<v1::JobEvent>* out) const;

  // The first event held in memory (for tests and stats).
  int64_t first_in_memory() const;

 private:
  void Notify();

  const int64_t max_in_memory_;
  const StoredEvents stored_;
  mutable absl::Mutex mu_;
  int64_t first_ ABSL_GUARDED_BY(mu_);  // the number of events_.front()
  // Shared, so that a reader copies them out of the lock: the appender
  // (the manager, holding its own lock) never waits on a reader's copies.
  std::deque<std::shared_ptr<const v1::JobEvent>> events_ ABSL_GUARDED_BY(mu_);
  v1::JobStateChange state_ ABSL_GUARDED_BY(mu_);
  WeakListeners<Listener> listeners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_JOB_EVENT_LOG_H_
