// The transport between the stages of a multi-stage assignment: every rank
// chooses the same one from the placements in its assignment
// (ChooseAssignmentTransport, which applies transport/transport_select.h),
// logs the choice and its reason and reports it to the controller
// (StageTransport, kept in the job's history); then TCP connects to the
// peers over the worker's PeerListener (transport/tcp_transport.h), and
// NCCL (every stage on its own GPU, transport/nccl_transport.h) is created
// with its unique ids exchanged through the controller: rank 0 puts them,
// the others get them, over a RemoteRendezvous on the worker's stream.
//
// Thread safety: StageTransports may be used from any thread; each call
// blocks until its transport is ready, fails, or the job is stopped.
#ifndef TRAINYARD_WORKER_STAGE_TRANSPORT_H_
#define TRAINYARD_WORKER_STAGE_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/device.h"
#include "proto/trainyard.pb.h"
#include "transport/rendezvous.h"
#include "transport/tcp_transport.h"
#include "transport/transport.h"
#include "transport/transport_select.h"
#include "worker/active_job.h"
#include "worker/report_outbox.h"
#include "worker/worker_options.h"

namespace trainyard {

// The transport the stages of a multi-stage assignment use, from its
// placements (the same on every rank, so every rank decides the same):
// transport/transport_select.h's ChooseTransport with `nccl_built`
// (NcclTransportBuilt() in the daemon). An assignment without placements
// (from a controller older than that field) uses TCP. Errors:
// InvalidArgument naming StageAssignment.placements when their number is
// not `num_stages` or one names a bad device or an empty host.
absl::StatusOr<TransportChoice> ChooseAssignmentTransport(
    const v1::StageAssignment& assignment, int num_stages, bool nccl_built);

// ConnectTcpTransport over `listener` (not owned; must outlive the
// factory's calls), giving up on peers after `connect_timeout`.
TransportFactory TcpTransportFactory(PeerListener* listener,
                                     absl::Duration connect_timeout);

// CreateNcclTransport, with the transport's streams ordered against the
// stage's compute stream on its GPU.
NcclTransportFactory DefaultNcclTransportFactory();

class StageTransports {
 public:
  // `options` (validated; must outlive this) give the timeouts, the
  // controller and the worker's name; `device` is where this worker
  // computes; `outbox` (must outlive this) carries the choice's report and
  // the rendezvous requests.
  StageTransports(const WorkerOptions& options, const Device& device,
                  TransportFactory connect, NcclTransportFactory create_nccl,
                  ReportOutbox* outbox);

  // The job's rendezvous store at the controller, reached through
  // whichever session is live: a request made while none is fails.
  std::unique_ptr<RemoteRendezvous> ControllerRendezvous(
      const std::string& job_id) const;

  // The transport of a multi-stage job: chosen from the placements,
  // reported, then connected (TCP) or created (NCCL). `pipeline` is this
  // replica's pipeline (stage s of `num_stages`); reports name
  // `report_rank` (the gang rank); the transport registers as
  // `transport_id` (the job id, or one per replica). `job`'s cancel flag
  // cuts the wait short; its rendezvous is registered while NCCL is
  // created.
  absl::StatusOr<std::unique_ptr<Transport>> Connect(
      const v1::StageAssignment& pipeline, int num_stages, int report_rank,
      const std::string& transport_id, ActiveJob* job);

 private:
  // CreateNcclTransport (or the injected factory) with a rendezvous
  // through the controller (the job's store; keys under `transport_id`).
  absl::StatusOr<std::unique_ptr<Transport>> CreateNccl(
      const std::string& job_id, const std::string& transport_id, int rank,
      int world_size, ActiveJob* job);

  const WorkerOptions& options_;
  const Device device_;
  const TransportFactory connect_;
  const NcclTransportFactory create_nccl_;
  ReportOutbox* const outbox_;
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_STAGE_TRANSPORT_H_
