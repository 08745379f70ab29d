// LogRing: one job's newest log lines from its workers (v1::LogLine), with
// change notification for WatchLogs' followers. In memory only.
//
// Lines are numbered densely from 0 (LogLine.seq) as they are appended;
// the ring keeps the newest `max_lines` of them within `max_bytes` of
// text, and each line's text is cut at `max_line_bytes` (on a UTF-8
// character boundary). A reader asking for a line no longer held is moved
// on to the oldest one held, and sees the gap in seq.
//
// A ring is closed when its job ends: followers finish once they have read
// every line.
//
// Ownership: shared by the JobManager and the WatchLogs streams reading
// it; listeners are held by weak_ptr. Thread safety: every method is
// thread-safe; listeners are called without the ring's lock held.
#ifndef TRAINYARD_CONTROLLER_LOG_RING_H_
#define TRAINYARD_CONTROLLER_LOG_RING_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "controller/weak_listeners.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

struct LogRingLimits {
  size_t max_lines = 10000;
  size_t max_bytes = size_t{4} << 20;  // of line text, all lines together
  size_t max_line_bytes = 1024;
};

// The longest prefix of `text` of at most `max_bytes` bytes that does not
// end inside a UTF-8 multi-byte character.
std::string CutUtf8(const std::string& text, size_t max_bytes);

class LogRing {
 public:
  class Listener {
   public:
    virtual ~Listener() = default;
    // Lines were appended, or the ring was closed. Called on the
    // appender's thread; must not block.
    virtual void OnLogLines() = 0;
  };

  explicit LogRing(LogRingLimits limits = {});

  // Appends `line` (its seq is set here, its text cut to the line limit),
  // drops the oldest lines beyond the limits, and notifies the listeners.
  // Ignored once closed. Returns the line's seq (-1 when ignored).
  int64_t Append(v1::LogLine line);
  // No more lines will come (the job ended); listeners are notified.
  void Close();

  struct Snapshot {
    int64_t end = 0;  // seq of the next line to be appended
    bool closed = false;
  };
  // Registers `listener` and returns the ring's state at that moment:
  // every later Append or Close is notified.
  Snapshot Subscribe(std::weak_ptr<Listener> listener);

  // Copies the line at `*seq` or, when that one is no longer held, the
  // oldest held after it, and sets *seq to the copied line's seq. False
  // when there is no line at or after *seq yet.
  bool Read(int64_t* seq, v1::LogLine* out) const;
  Snapshot state() const;
  // Lines and text bytes held.
  size_t lines() const;
  size_t bytes() const;

 private:
  void Notify();

  const LogRingLimits limits_;
  mutable absl::Mutex mu_;
  std::deque<v1::LogLine> lines_ ABSL_GUARDED_BY(mu_);
  int64_t first_seq_ ABSL_GUARDED_BY(mu_) = 0;  // seq of lines_.front()
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  WeakListeners<Listener> listeners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_LOG_RING_H_
