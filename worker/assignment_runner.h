// AssignmentRunner: runs one StageAssignment to its end. Plans the assigned
// spec against the worker's data folder, finds the stage's place in the
// job's gang (gang rank r S + s: stage s of replica r), opens the transport
// to the other stages of its replica (worker/stage_transport.h) and joins
// the group of its copies in the other replicas, restores it from in-memory
// snapshots, a checkpoint or nothing, and runs it (engine/stage_runner.h),
// reporting its start, steps, evals, held snapshots and committed
// checkpoints through the outbox. An infer or eval job's stage runs
// forward only (engine/forward_job.h), reporting its output shards.
//
// Thread safety: Run may be called from any thread, one assignment at a
// time.
#ifndef TRAINYARD_WORKER_ASSIGNMENT_RUNNER_H_
#define TRAINYARD_WORKER_ASSIGNMENT_RUNNER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "engine/job_log.h"
#include "engine/replica_group.h"
#include "engine/stage_runner.h"
#include "plan/job_plan.h"
#include "proto/trainyard.pb.h"
#include "transport/transport.h"
#include "worker/active_job.h"
#include "worker/report_outbox.h"
#include "worker/snapshot_cache.h"
#include "worker/stage_transport.h"
#include "worker/worker_metrics.h"
#include "worker/worker_options.h"

namespace trainyard {

// Where an assignment's stage sits in its job's gang.
struct GangPlace {
  Gang gang;
  int rank = 0;     // StageAssignment.rank: r S + s
  int stage = 0;    // s
  int replica = 0;  // r
  // The assignment as this replica's pipeline sees it: stage s of S, with
  // the pipeline's S peer addresses and placements.
  v1::StageAssignment pipeline;
  // Each replica's pipeline is its own transport, so its connections are
  // registered under their own id: the job id, or "<job>/replica-<r>".
  std::string transport_id;
};

class AssignmentRunner {
 public:
  // What the runner uses, all owned by the worker and outliving it.
  struct Parts {
    const WorkerOptions* options = nullptr;  // validated
    Device device = Device::Cpu();           // where stages compute
    std::string peer_address;                // where peers dial this worker
    StageTransports* transports = nullptr;
    ReportOutbox* outbox = nullptr;
    SnapshotCache* snapshots = nullptr;
    WorkerMetrics* metrics = nullptr;  // null without --metrics_listen
    JobLogForwarder* job_log = nullptr;
  };

  explicit AssignmentRunner(Parts parts) : parts_(std::move(parts)) {}

  // Runs `assignment` until its stage ends, on the calling thread; `job`
  // stops it. Errors: InvalidArgument naming the StageAssignment field or
  // the spec's problems ("invalid job spec: ..."), or the stage's own
  // (connecting, starting, training).
  absl::Status Run(const v1::StageAssignment& assignment, ActiveJob* job);

 private:
  absl::StatusOr<JobPlan> Plan(const v1::JobSpec& spec) const;
  // The group of this stage's copies (null with one replica), which find
  // each other through the job's rendezvous store at the controller. On
  // failure `transport` (may be null) is aborted.
  absl::StatusOr<std::unique_ptr<ReplicaGroup>> JoinReplicas(
      const v1::StageAssignment& assignment, const GangPlace& place,
      Transport* transport, ActiveJob* job);
  // The context a stage of `plan` computes in, on the worker's device.
  absl::StatusOr<std::unique_ptr<ExecContext>> Context(
      const JobPlan& plan) const;
  // The worker's stage options for its place in the gang.
  StageOptions StageOptionsOf(const GangPlace& place, const ExecContext* exec,
                              ReplicaGroup* replica_group) const;
  // Starts the stage and runs it through the rest of the job.
  absl::Status StartAndRun(const v1::StageAssignment& assignment,
                           const JobPlan& plan, const GangPlace& place,
                           Transport* transport, ReplicaGroup* replica_group,
                           ActiveJob* job);
  // An infer or eval job's stage: its model pinned and loaded, its rows run
  // forward, its output shards written and reported (the last stage of
  // each replica of an inference job).
  absl::Status StartAndRunForward(const v1::StageAssignment& assignment,
                                  JobPlan plan, const GangPlace& place,
                                  Transport* transport, ActiveJob* job);
  // The snapshot this stage restarts from (StageAssignment.snapshot), sent
  // by the worker that holds it; nullopt when it starts otherwise.
  absl::StatusOr<std::optional<StageSnapshot>> ReceiveSnapshot(
      const v1::StageAssignment& assignment, int num_stages, int stage,
      Transport* transport);
  StageRunOptions RunOptions(const v1::StageAssignment& assignment,
                             const JobPlan& plan, const GangPlace& place,
                             Transport* transport, StageMetrics* metrics,
                             ActiveJob* job);
  // Keeps a snapshot of `job_id` and tells the controller.
  void KeepSnapshot(const std::string& job_id, StageSnapshot snapshot);

  const Parts parts_;
};

// Where `assignment`'s stage sits in the gang of `plan`. InvalidArgument
// naming the StageAssignment field when it does not fit the plan.
absl::StatusOr<GangPlace> PlaceInGang(const JobPlan& plan,
                                      const v1::StageAssignment& assignment);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_ASSIGNMENT_RUNNER_H_
