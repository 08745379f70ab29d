#include "transport/in_process_transport.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace trainyard {

class InProcessHub::Rank : public Transport, private ReducePeers {
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
    return RankOrderedAllReduceSum(rank_, world_size(), this, values, timeout);
  }
  void Abort(const absl::Status& reason) override { hub_->Abort(reason); }

 private:
  absl::StatusOr<int64_t> StartReduceRound() override {
    return hub_->StartReduceRound(rank_);
  }
  absl::Status SendReduce(int peer, ReduceMessage message) override {
    return hub_->SendReduce(rank_, peer, std::move(message));
  }
  absl::StatusOr<ReduceMessage> RecvReduce(int peer, int64_t round,
                                           absl::Time deadline,
                                           absl::Duration timeout) override {
    return hub_->RecvReduce(rank_, peer, round, deadline, timeout);
  }
  absl::Status FailReduceRound(int64_t round,
                               const std::string& reason) override {
    return hub_->FailReduceRound(reason);
  }

  InProcessHub* hub_;
  int rank_;
};

InProcessHub::InProcessHub(int world_size) : rounds_started_(world_size, 0) {
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

void InProcessHub::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) {
    aborted_ = reason.ok() ? absl::AbortedError("aborted") : reason;
  }
}

absl::StatusOr<int64_t> InProcessHub::StartReduceRound(int rank) {
  absl::MutexLock lock(&mu_);
  if (!aborted_.ok()) return absl::AbortedError(aborted_.message());
  return rounds_started_[rank]++;
}

absl::Status InProcessHub::SendReduce(int from, int to, ReduceMessage message) {
  absl::MutexLock lock(&mu_);
  if (!aborted_.ok()) return absl::AbortedError(aborted_.message());
  reduce_channels_[{from, to}].push_back(std::move(message));
  return absl::OkStatus();
}

absl::StatusOr<ReduceMessage> InProcessHub::RecvReduce(int to, int from,
                                                       int64_t round,
                                                       absl::Time deadline,
                                                       absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto& channel = reduce_channels_[{from, to}];
  auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !channel.empty() || !aborted_.ok();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    const auto missing =
        std::count_if(rounds_started_.begin(), rounds_started_.end(),
                      [round](int64_t started) { return started <= round; });
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", to, ": all-reduce: ", missing,
        " rank(s) did not arrive within ", absl::FormatDuration(timeout)));
  }
  if (!aborted_.ok()) return absl::AbortedError(aborted_.message());
  ReduceMessage m = std::move(channel.front());
  channel.pop_front();
  return m;
}

// Every rank shares the hub's state, so the round ends for all of them by
// aborting the hub: the other ranks' waits return at once.
absl::Status InProcessHub::FailReduceRound(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) {
    aborted_ = absl::InternalError(absl::StrCat("all-reduce: ", reason));
  }
  return absl::AbortedError(aborted_.message());
}

}  // namespace trainyard
