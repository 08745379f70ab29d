#include "transport/in_process_transport.h"

#include "absl/strings/str_cat.h"

namespace trainyard {

class InProcessHub::Rank : public Transport {
 public:
  Rank(InProcessHub* hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return hub_->world_size(); }
  bool SharesDeviceMemory() const override { return true; }
  absl::Status Send(int peer, Message message) override {
    return hub_->Send(rank_, peer, std::move(message));
  }
  absl::StatusOr<Message> Recv(int peer, absl::Duration timeout) override {
    return hub_->Recv(rank_, peer, timeout);
  }
  absl::Status AllReduceSum(std::vector<double>* values,
                            absl::Duration timeout) override {
    return hub_->AllReduceSum(rank_, values, timeout);
  }
  void Abort(const absl::Status& reason) override { hub_->Abort(reason); }

 private:
  InProcessHub* hub_;
  int rank_;
};

InProcessHub::InProcessHub(int world_size)
    : contributions_(world_size), contributed_(world_size, false) {
  for (int r = 0; r < world_size; ++r) {
    ranks_.push_back(std::make_unique<Rank>(this, r));
  }
}

InProcessHub::~InProcessHub() = default;

Transport* InProcessHub::rank(int r) { return ranks_[r].get(); }

absl::Status InProcessHub::Send(int from, int to, Message message) {
  if (to < 0 || to >= world_size() || to == from) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", from, ": cannot send to rank ", to, " of ", world_size()));
  }
  absl::MutexLock lock(&mu_);
  if (!aborted_.ok()) return absl::AbortedError(aborted_.message());
  channels_[{from, to}].push_back(std::move(message));
  return absl::OkStatus();
}

absl::StatusOr<Message> InProcessHub::Recv(int to, int from,
                                           absl::Duration timeout) {
  if (from < 0 || from >= world_size() || to == from) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", to, ": cannot receive from rank ", from, " of ",
                     world_size()));
  }
  absl::MutexLock lock(&mu_);
  auto& channel = channels_[{from, to}];
  auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !channel.empty() || !aborted_.ok();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("rank ", to, ": no message from rank ", from, " within ",
                     absl::FormatDuration(timeout)));
  }
  if (!aborted_.ok()) return absl::AbortedError(aborted_.message());
  Message m = std::move(channel.front());
  channel.pop_front();
  return m;
}

absl::Status InProcessHub::AllReduceSum(int rank, std::vector<double>* values,
                                        absl::Duration timeout) {
  const int n = world_size();
  absl::MutexLock lock(&mu_);
  if (!aborted_.ok()) return absl::AbortedError(aborted_.message());
  // Wait until the previous round has been fully collected.
  auto slot_free = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !contributed_[rank] || !aborted_.ok();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&slot_free), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("rank ", rank, ": all-reduce did not start in time"));
  }
  if (!aborted_.ok()) return absl::AbortedError(aborted_.message());
  const int64_t my_round = round_;
  contributions_[rank] = *values;
  contributed_[rank] = true;
  if (++arrived_ == n) {
    for (int r = 0; r < n; ++r) {
      if (contributions_[r].size() != contributions_[0].size()) {
        aborted_ = absl::InternalError(absl::StrCat(
            "all-reduce: rank ", r, " sent ", contributions_[r].size(),
            " values, rank 0 sent ", contributions_[0].size()));
        return absl::AbortedError(aborted_.message());
      }
    }
    result_.assign(contributions_[0].size(), 0.0);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < result_.size(); ++i) {
        result_[i] += contributions_[r][i];
      }
    }
    arrived_ = 0;
    ++round_;
  }
  auto finished = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return round_ != my_round || !aborted_.ok();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&finished), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", rank, ": all-reduce: ", n - arrived_,
        " rank(s) did not arrive within ", absl::FormatDuration(timeout)));
  }
  if (!aborted_.ok()) return absl::AbortedError(aborted_.message());
  *values = result_;
  contributed_[rank] = false;
  return absl::OkStatus();
}

void InProcessHub::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) {
    aborted_ = reason.ok() ? absl::AbortedError("aborted") : reason;
  }
}

}  // namespace trainyard
