#include "transport/collectives.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"

namespace trainyard {
namespace {

using Kind = ReduceMessage::Kind;

// A rank other than 0: sends its values, takes rank 0's answer.
absl::Status ContributeAndWait(int rank, int64_t round, ReducePeers* peers,
                               std::vector<double>* values, absl::Time deadline,
                               absl::Duration timeout) {
  const std::string me = ReduceRoundName(rank, round);
  RETURN_IF_ERROR(peers->SendReduce(0, {Kind::kContribution, round, *values}));
  ASSIGN_OR_RETURN(ReduceMessage answer,
                   peers->RecvReduce(0, round, deadline, timeout));
  if (answer.kind == Kind::kError) {
    return absl::InvalidArgumentError(
        absl::StrCat(me, ": rank 0 failed the round: ", answer.error));
  }
  if (answer.kind != Kind::kResult || answer.round != round ||
      answer.values.size() != values->size()) {
    return absl::InternalError(
        absl::StrCat(me, ": unexpected ", ReduceMessageKindName(answer.kind),
                     " frame for round ", answer.round, " from rank 0"));
  }
  *values = std::move(answer.values);
  return absl::OkStatus();
}

// Rank 0: takes every other rank's contribution in rank order into
// parts[r]. Returns why the round cannot complete ("" when it can), or the
// transport's error.
absl::StatusOr<std::string> Gather(int world_size, int64_t round,
                                   ReducePeers* peers, size_t length,
                                   absl::Time deadline, absl::Duration timeout,
                                   std::vector<std::vector<double>>* parts) {
  for (int r = 1; r < world_size; ++r) {
    ASSIGN_OR_RETURN(ReduceMessage m,
                     peers->RecvReduce(r, round, deadline, timeout));
    if (m.kind != Kind::kContribution || m.round != round) {
      return absl::StrCat("unexpected ", ReduceMessageKindName(m.kind),
                          " frame for round ", m.round, " from rank ", r);
    }
    if (m.values.size() != length) {
      return absl::StrCat("rank ", r, " sent ", m.values.size(),
                          " values, rank 0 sent ", length);
    }
    (*parts)[r] = std::move(m.values);
  }
  return std::string();
}

}  // namespace

const char* ReduceMessageKindName(ReduceMessage::Kind kind) {
  switch (kind) {
    case Kind::kContribution:
      return "all-reduce-contribution";
    case Kind::kResult:
      return "all-reduce-result";
    case Kind::kError:
      return "all-reduce-error";
  }
  return "?";
}

std::string ReduceRoundName(int rank, int64_t round) {
  return absl::StrCat("rank ", rank, ": all-reduce round ", round);
}

absl::Status RankOrderedAllReduceSum(int rank, int world_size,
                                     ReducePeers* peers,
                                     std::vector<double>* values,
                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  ASSIGN_OR_RETURN(const int64_t round, peers->StartReduceRound());
  if (rank != 0) {
    return ContributeAndWait(rank, round, peers, values, deadline, timeout);
  }
  std::vector<std::vector<double>> parts(world_size);
  ASSIGN_OR_RETURN(const std::string failure,
                   Gather(world_size, round, peers, values->size(), deadline,
                          timeout, &parts));
  if (!failure.empty()) return peers->FailReduceRound(round, failure);
  std::vector<double> sum(values->size(), 0.0);
  for (int r = 0; r < world_size; ++r) {
    const std::vector<double>& v = r == 0 ? *values : parts[r];
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
  }
  *values = std::move(sum);
  for (int r = 1; r < world_size; ++r) {
    RETURN_IF_ERROR(peers->SendReduce(r, {Kind::kResult, round, *values}));
  }
  return absl::OkStatus();
}

}  // namespace trainyard
