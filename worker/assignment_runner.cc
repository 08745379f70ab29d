#include "worker/assignment_runner.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/forward_job.h"
#include "engine/output_shards.h"
#include "engine/stage.h"
#include "engine/stage_wiring.h"
#include "glog/logging.h"
#include "kernels/exec_context.h"
#include "net/address.h"
#include "worker/report_messages.h"

namespace trainyard {
namespace {

using ::trainyard::v1::SnapshotResume;
using ::trainyard::v1::StageAssignment;

// `assignment` (every rank of the gang) as replica `replica`'s pipeline
// sees it: its stage s of S, its ranks' addresses and placements.
absl::StatusOr<StageAssignment> ReplicaPipeline(
    const StageAssignment& assignment, const Gang& gang, int replica) {
  if (assignment.peer_addresses_size() != gang.size() ||
      (assignment.placements_size() > 0 &&
       assignment.placements_size() != gang.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StageAssignment: a job of ", gang.stages, " stages x ", gang.replicas,
        " replicas needs ", gang.size(), " peer addresses and placements"));
  }
  StageAssignment pipeline = assignment;
  // Within one replica's pipeline a rank is its stage.
  pipeline.set_rank(gang.StageOf(assignment.rank()));
  pipeline.clear_peer_addresses();
  pipeline.clear_placements();
  for (int k = gang.RankOf(replica, 0); k < gang.RankOf(replica + 1, 0); ++k) {
    pipeline.add_peer_addresses(assignment.peer_addresses(k));
    if (assignment.placements_size() > 0) {
      *pipeline.add_placements() = assignment.placements(k);
    }
  }
  return pipeline;
}

}  // namespace

absl::StatusOr<GangPlace> PlaceInGang(const JobPlan& plan,
                                      const StageAssignment& assignment) {
  GangPlace place;
  place.gang = plan.gang();
  const Gang& gang = place.gang;
  place.rank = assignment.rank();
  if (place.rank < 0 || place.rank >= gang.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageAssignment.rank: must be in [0, ", gang.size(),
                     ") for this job, got ", place.rank));
  }
  place.stage = gang.StageOf(place.rank);
  place.replica = gang.ReplicaOf(place.rank);
  if (gang.replicas > 1 && assignment.snapshot().step() > 0) {
    return absl::InvalidArgumentError(
        "StageAssignment.snapshot: a job with replicas resumes from "
        "checkpoints only");
  }
  if (gang.replicas > 1) {
    ASSIGN_OR_RETURN(place.pipeline,
                     ReplicaPipeline(assignment, gang, place.replica));
    place.transport_id =
        absl::StrCat(assignment.job_id(), "/replica-", place.replica);
  } else {
    place.pipeline = assignment;
    place.transport_id = assignment.job_id();
  }
  return place;
}

absl::Status AssignmentRunner::Run(const StageAssignment& assignment,
                                   ActiveJob* job) {
  if (assignment.job_id().empty()) {
    return absl::InvalidArgumentError("StageAssignment.job_id: empty");
  }
  ASSIGN_OR_RETURN(const JobPlan plan, Plan(assignment.spec()));
  ASSIGN_OR_RETURN(const GangPlace place, PlaceInGang(plan, assignment));
  std::unique_ptr<Transport> transport;
  if (plan.num_stages() > 1) {
    ASSIGN_OR_RETURN(transport, parts_.transports->Connect(
                                    place.pipeline, plan.num_stages(),
                                    place.rank, place.transport_id, job));
    job->SetTransport(transport.get());
  }
  // Snapshots of another job are of no use any more.
  parts_.snapshots->UseFor(assignment.job_id());
  absl::Status status;
  if (plan.trains()) {
    ASSIGN_OR_RETURN(std::unique_ptr<ReplicaGroup> replica_group,
                     JoinReplicas(assignment, place, transport.get(), job));
    status = StartAndRun(assignment, plan, place, transport.get(),
                         replica_group.get(), job);
  } else {
    // A forward-only job's replicas never talk to each other.
    status = StartAndRunForward(assignment, plan, place, transport.get(), job);
  }
  if (!status.ok() && transport != nullptr) {
    // Stopped by this worker itself (draining, cut off): the peers hear that
    // cause, not the stage's own "cancelled".
    absl::Status cause = status;
    if (const auto [reason, cancelled] = job->abort_reason();
        !reason.ok() && !cancelled) {
      cause = reason;
    }
    transport->Abort(StageFailure(place.gang, place.rank, cause,
                                  /*name_replica=*/false));
  }
  job->SetTransport(nullptr);
  // The stage is gone: give its cached host blocks back (the next job may
  // have other shapes).
  HostAllocator()->EmptyCache();
  return status;
}

absl::StatusOr<JobPlan> AssignmentRunner::Plan(const v1::JobSpec& spec) const {
  PlanOptions plan_options;
  plan_options.base_dir = parts_.options->data_dir;
  // With a --data_dir, a spec's paths must stay inside it.
  plan_options.confine_to = parts_.options->data_dir;
  plan_options.memory_limit_bytes = parts_.options->memory_bytes;
  plan_options.check_files = true;
  absl::StatusOr<JobPlan> plan = PlanJob(spec, plan_options);
  if (!plan.ok()) return Prefixed(plan.status(), "invalid job spec: ");
  return plan;
}

absl::StatusOr<std::unique_ptr<ReplicaGroup>> AssignmentRunner::JoinReplicas(
    const StageAssignment& assignment, const GangPlace& place,
    Transport* transport, ActiveJob* job) {
  if (place.gang.replicas <= 1) return std::unique_ptr<ReplicaGroup>();
  const WorkerOptions& options = *parts_.options;
  std::unique_ptr<RemoteRendezvous> rendezvous =
      parts_.transports->ControllerRendezvous(assignment.job_id());
  job->SetRendezvous(rendezvous.get());
  absl::StatusOr<std::unique_ptr<ReplicaGroup>> joined = JoinStageReplicas(
      rendezvous.get(), place.gang, place.rank,
      absl::StrCat(assignment.job_id(), "/attempt-", assignment.attempt()),
      HostOfAddress(parts_.peer_address),
      std::min(options.stage_timeout, options.peer_connect_timeout));
  job->SetRendezvous(nullptr);
  if (!joined.ok()) {
    if (transport != nullptr) transport->Abort(joined.status());
    job->SetTransport(nullptr);
    return Prefixed(joined.status(), "joining the other replicas: ");
  }
  return joined;
}

absl::StatusOr<std::unique_ptr<ExecContext>> AssignmentRunner::Context(
    const JobPlan& plan) const {
  ASSIGN_OR_RETURN(const Precision precision,
                   PrecisionFromName(plan.spec.precision()));
  return ExecContext::Create(parts_.device, precision);
}

StageOptions AssignmentRunner::StageOptionsOf(
    const GangPlace& place, const ExecContext* exec,
    ReplicaGroup* replica_group) const {
  const WorkerOptions& options = *parts_.options;
  StageOptions base;
  base.plugin_dir = options.plugin_dir;
  base.data_dir = options.data_dir;
  base.timeout = options.stage_timeout;
  return GangStageOptions(base, place.gang, place.rank, exec, replica_group);
}

absl::Status AssignmentRunner::StartAndRun(const StageAssignment& assignment,
                                           const JobPlan& plan,
                                           const GangPlace& place,
                                           Transport* transport,
                                           ReplicaGroup* replica_group,
                                           ActiveJob* job) {
  const WorkerOptions& options = *parts_.options;
  ASSIGN_OR_RETURN(std::unique_ptr<ExecContext> exec, Context(plan));
  const StageOptions stage_options =
      StageOptionsOf(place, exec.get(), replica_group);
  ASSIGN_OR_RETURN(
      std::optional<StageSnapshot> snapshot,
      ReceiveSnapshot(assignment, plan.num_stages(), place.stage, transport));
  ASSIGN_OR_RETURN(
      StartedStage started,
      StartStage(plan, place.stage, transport, stage_options,
                 snapshot ? &*snapshot : nullptr,
                 assignment.has_max_resume_step() ? assignment.max_resume_step()
                                                  : -1));
  std::unique_ptr<Stage> stage = std::move(started.stage);
  const std::string& job_id = assignment.job_id();
  if (started.resume_step > 0) {
    LOG(INFO) << "trainyard-worker " << options.name << ": job " << job_id
              << " stage " << place.stage << " resumed at step "
              << started.resume_step;
  }
  parts_.outbox->Report(
      StartedMessage(job_id, place.rank, started.resume_step));
  std::unique_ptr<StageMetrics> metrics =
      parts_.metrics != nullptr ? parts_.metrics->OfStage(place.stage)
                                : nullptr;
  return RunStage(
      *stage, transport, plan,
      RunOptions(assignment, plan, place, transport, metrics.get(), job));
}

absl::Status AssignmentRunner::StartAndRunForward(
    const StageAssignment& assignment, JobPlan plan, const GangPlace& place,
    Transport* transport, ActiveJob* job) {
  const WorkerOptions& options = *parts_.options;
  const std::string& job_id = assignment.job_id();
  RETURN_IF_ERROR(PinModelCheckpoint(&plan));
  ASSIGN_OR_RETURN(std::unique_ptr<ExecContext> exec, Context(plan));
  const StageOptions stage_options = StageOptionsOf(place, exec.get(), nullptr);
  // The last stage of each replica writes its shards of the outputs.
  const bool writes =
      plan.kind == JobKind::kInfer && place.stage == plan.loss_stage();
  ASSIGN_OR_RETURN(
      std::unique_ptr<Stage> stage,
      StartForwardStage(plan, place.stage, transport, stage_options));
  // After the model was checked against the spec.
  std::unique_ptr<OutputShards> outputs;
  if (writes) {
    ASSIGN_OR_RETURN(OutputJob output_job, OutputJobOf(plan));
    ASSIGN_OR_RETURN(outputs, OutputShards::Open(output_job));
  }
  parts_.outbox->Report(StartedMessage(job_id, place.rank, 0));
  ForwardRunOptions run;
  run.replica = place.replica;
  run.transport = transport;
  run.timeout = options.stage_timeout;
  run.cancel = job->cancel_flag();
  run.outputs = outputs.get();
  const int rank = place.rank;
  auto report_progress = [this, &plan, job_id, rank](int64_t shard) {
    absl::StatusOr<OutputProgress> p = CountOutputs(plan);
    if (!p.ok()) {
      LOG(WARNING) << "job " << job_id
                   << ": counting its outputs: " << p.status();
      return;
    }
    parts_.outbox->Report(ShardMessage(job_id, rank, shard, *p));
  };
  run.on_shard = [report_progress](int64_t shard, int64_t, double) {
    report_progress(shard);
  };
  run.on_eval = [this, job_id, rank](int64_t step, const EvalReport& report) {
    parts_.outbox->Report(EvalMessage(job_id, rank, step, report));
  };
  if (writes) report_progress(-1);
  RETURN_IF_ERROR(RunForwardStage(*stage, plan, run));
  return writes ? FinishWhenComplete(plan, outputs.get()) : absl::OkStatus();
}

absl::StatusOr<std::optional<StageSnapshot>> AssignmentRunner::ReceiveSnapshot(
    const StageAssignment& assignment, int num_stages, int stage,
    Transport* transport) {
  if (assignment.snapshot().step() <= 0) return std::optional<StageSnapshot>();
  const SnapshotResume& from = assignment.snapshot();
  if (from.source_ranks_size() != num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("StageAssignment.snapshot.source_ranks: the job has ",
                     num_stages, " stages, got ", from.source_ranks_size()));
  }
  for (int src : from.source_ranks()) {
    if (src < 0 || src >= num_stages) {
      return absl::InvalidArgumentError(
          absl::StrCat("StageAssignment.snapshot.source_ranks: rank ", src,
                       " is not in [0, ", num_stages, ")"));
    }
  }
  ASSIGN_OR_RETURN(StageSnapshot snapshot,
                   DistributeSnapshots(
                       transport, stage, from.step(),
                       std::vector<int>(from.source_ranks().begin(),
                                        from.source_ranks().end()),
                       [&](int k) {
                         return parts_.snapshots->Held(assignment.job_id(), k,
                                                       from.step());
                       },
                       parts_.options->stage_timeout));
  return std::optional<StageSnapshot>(std::move(snapshot));
}

StageRunOptions AssignmentRunner::RunOptions(const StageAssignment& assignment,
                                             const JobPlan& plan,
                                             const GangPlace& place,
                                             Transport* transport,
                                             StageMetrics* metrics,
                                             ActiveJob* job) {
  const std::string job_id = assignment.job_id();
  const int s = place.stage;
  const int rank = place.rank;
  StageRunOptions run =
      GangRunOptions(place.gang, rank, parts_.options->stage_timeout);
  run.cancel = job->cancel_flag();
  run.snapshot_every = plan.spec.recovery().snapshot_every();
  run.may_commit = [outbox = parts_.outbox] { return outbox->live(); };
  run.on_snapshot = [this, job_id, s](StageSnapshot snap) {
    if (parts_.metrics != nullptr) {
      parts_.metrics->SnapshotKept(snap.stage == s);
    }
    KeepSnapshot(job_id, std::move(snap));
  };
  if (parts_.metrics != nullptr) {
    run.on_checkpoint_file = [metrics = parts_.metrics](double seconds) {
      metrics->CheckpointWritten(seconds);
    };
  }
  if (rank == 0) {
    // The controller weighs committed checkpoints against snapshots.
    run.on_checkpoint = [this, job_id, s](int64_t step,
                                          const std::string& dir) {
      {
        // On the checkpoint writer's thread.
        ScopedJobLog scope(parts_.job_log, job_id, s);
        LOG(INFO) << "trainyard-worker " << parts_.options->name << ": job "
                  << job_id << " checkpoint step " << step << " saved in "
                  << dir;
      }
      parts_.outbox->Report(HeldMessage(job_id, -1, step));
    };
  }
  run.on_step = [this, job_id, rank, metrics, transport](
                    const StepReport& report, double seconds) {
    if (metrics != nullptr) metrics->Record(report, seconds, transport);
    parts_.outbox->Report(StepMessage(job_id, rank, report, seconds));
  };
  // Every stage reports its evals (the pass is a span of its trace); the
  // controller publishes the last stage's metrics.
  run.on_eval = [this, job_id, rank](int64_t step, const EvalReport& report) {
    parts_.outbox->Report(EvalMessage(job_id, rank, step, report));
  };
  return run;
}

void AssignmentRunner::KeepSnapshot(const std::string& job_id,
                                    StageSnapshot snapshot) {
  const int stage = snapshot.stage;
  const int64_t step = snapshot.step;
  parts_.snapshots->Keep(job_id, std::move(snapshot));
  parts_.outbox->Report(HeldMessage(job_id, stage, step));
}

}  // namespace trainyard
