// In-process Transport: N ranks as threads of one process, sharing a hub of
// mutex-protected FIFO channels. Used by `trainyard train` and by tests of
// multi-stage logic before it runs across processes.
//
// Ownership: InProcessHub owns every rank's Transport; it must outlive the
// threads that use them. Thread-safe as described in transport.h.
#ifndef TRAINYARD_TRANSPORT_IN_PROCESS_TRANSPORT_H_
#define TRAINYARD_TRANSPORT_IN_PROCESS_TRANSPORT_H_

#include <deque>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "transport/transport.h"

namespace trainyard {

class InProcessHub {
 public:
  explicit InProcessHub(int world_size);
  InProcessHub(const InProcessHub&) = delete;
  InProcessHub& operator=(const InProcessHub&) = delete;

  ~InProcessHub();
  Transport* rank(int r);
  int world_size() const { return static_cast<int>(ranks_.size()); }

 private:
  class Rank;
  friend class Rank;

  absl::Status Send(int from, int to, Message message);
  absl::StatusOr<Message> Recv(int to, int from, absl::Duration timeout);
  absl::Status AllReduceSum(int rank, std::vector<double>* values,
                            absl::Duration timeout);
  void Abort(const absl::Status& reason);

  absl::Mutex mu_;
  std::map<std::pair<int, int>, std::deque<Message>> channels_
      ABSL_GUARDED_BY(mu_);  // (from, to) -> messages
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  // All-reduce rendezvous: contributions of the current round by rank.
  std::vector<std::vector<double>> contributions_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> contributed_ ABSL_GUARDED_BY(mu_);
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<double> result_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_IN_PROCESS_TRANSPORT_H_
