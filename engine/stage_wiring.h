// How one stage of a job's gang (plan/job_plan.h's Gang: R replicas of an
// S-stage pipeline, gang rank r S + s) is wired to the others, the same for
// `trainyard train` (engine/local_job.h: every stage a thread of one
// process) and the worker daemon (one stage per process): the replica group
// its copies in the other replicas sum their gradients through, its
// StageOptions and StageRunOptions, and the status it stops the other
// stages with when it fails.
//
// Thread safety: the functions keep no state; JoinStageReplicas blocks
// until every replica joined (or failed).
#ifndef TRAINYARD_ENGINE_STAGE_WIRING_H_
#define TRAINYARD_ENGINE_STAGE_WIRING_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/replica_group.h"
#include "engine/stage.h"
#include "engine/stage_runner.h"
#include "kernels/exec_context.h"
#include "plan/job_plan.h"
#include "transport/rendezvous.h"

namespace trainyard {

// Joins the replica group of gang rank `rank`: the copies of its stage s in
// every replica, which meet through `rendezvous` (used only during the
// call) under the keys "<key_prefix>/stage-<s>". Gloo binds and advertises
// `hostname`; `timeout` bounds the join and every collective. Null when the
// gang has one replica. Errors: ReplicaGroup::Join's.
absl::StatusOr<std::unique_ptr<ReplicaGroup>> JoinStageReplicas(
    Rendezvous* rendezvous, const Gang& gang, int rank,
    const std::string& key_prefix, const std::string& hostname,
    absl::Duration timeout);

// `base` (plugin_dir, timeout, ...) for gang rank `rank`: its replica, the
// group of its copies (`replica_group`, null with one replica) and the
// context it computes in (`exec`); both must outlive the stage.
StageOptions GangStageOptions(StageOptions base, const Gang& gang, int rank,
                              const ExecContext* exec,
                              ReplicaGroup* replica_group);

// The run options every stage of a gang starts from: `timeout` for its
// neighbours and the all-reduce; replicas hold the same state, so only the
// first replica writes checkpoints (write_checkpoints), and only its
// callbacks about them are worth setting.
StageRunOptions GangRunOptions(const Gang& gang, int rank,
                               absl::Duration timeout);

// The status a stage that failed with `cause` aborts the other stages'
// transports with: the cause's code and "stage <s> failed: <cause>", or
// "replica <r> stage <s> failed: <cause>" when `name_replica` (the stages
// that hear it are not all of its own replica).
absl::Status StageFailure(const Gang& gang, int rank, const absl::Status& cause,
                          bool name_replica);

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_STAGE_WIRING_H_
