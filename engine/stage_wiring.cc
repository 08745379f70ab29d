#include "engine/stage_wiring.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace trainyard {

absl::StatusOr<std::unique_ptr<ReplicaGroup>> JoinStageReplicas(
    Rendezvous* rendezvous, const Gang& gang, int rank,
    const std::string& key_prefix, const std::string& hostname,
    absl::Duration timeout) {
  if (gang.replicas <= 1) return std::unique_ptr<ReplicaGroup>();
  ReplicaGroupOptions options;
  options.rank = gang.ReplicaOf(rank);
  options.size = gang.replicas;
  options.key_prefix = absl::StrCat(key_prefix, "/stage-", gang.StageOf(rank));
  options.hostname = hostname;
  options.timeout = timeout;
  return ReplicaGroup::Join(rendezvous, options);
}

StageOptions GangStageOptions(StageOptions base, const Gang& gang, int rank,
                              const ExecContext* exec,
                              ReplicaGroup* replica_group) {
  base.exec = exec;
  base.replica = gang.ReplicaOf(rank);
  base.replica_group = replica_group;
  return base;
}

StageRunOptions GangRunOptions(const Gang& gang, int rank,
                               absl::Duration timeout) {
  StageRunOptions run;
  run.timeout = timeout;
  run.write_checkpoints = gang.ReplicaOf(rank) == 0;
  return run;
}

absl::Status StageFailure(const Gang& gang, int rank, const absl::Status& cause,
                          bool name_replica) {
  return absl::Status(
      cause.code(),
      absl::StrCat(name_replica
                       ? absl::StrCat("replica ", gang.ReplicaOf(rank), " ")
                       : "",
                   "stage ", gang.StageOf(rank), " failed: ", cause.message()));
}

}  // namespace trainyard
