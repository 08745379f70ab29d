#include "worker/stage_transport.h"

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "kernels/exec_context.h"
#include "transport/nccl_transport.h"
#include "worker/report_messages.h"

namespace trainyard {

absl::StatusOr<TransportChoice> ChooseAssignmentTransport(
    const v1::StageAssignment& assignment, int num_stages, bool nccl_built) {
  if (assignment.placements_size() == 0) {
    TransportChoice choice;
    choice.kind = TransportKind::kTcp;
    choice.reason =
        "the assignment names no stage placements (a controller older than "
        "this worker): using TCP";
    return choice;
  }
  if (assignment.placements_size() != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StageAssignment.placements: the job has ", num_stages, " stages, got ",
        assignment.placements_size(), " placements"));
  }
  std::vector<StagePlacement> stages;
  for (const v1::StagePlacement& p : assignment.placements()) {
    stages.push_back({p.host(), p.device()});
  }
  absl::StatusOr<TransportChoice> choice = ChooseTransport(stages, nccl_built);
  if (!choice.ok()) {
    return Prefixed(choice.status(), "StageAssignment.placements: ");
  }
  return choice;
}

TransportFactory TcpTransportFactory(PeerListener* listener,
                                     absl::Duration connect_timeout) {
  return [listener, connect_timeout](const std::string& job_id, int rank,
                                     const std::vector<std::string>& peers,
                                     const std::string& secret,
                                     const std::atomic<bool>* cancel) {
    TcpTransportOptions tcp;
    tcp.job_id = job_id;
    tcp.rank = rank;
    tcp.peer_addresses = peers;
    tcp.secret = secret;
    tcp.connect_timeout = connect_timeout;
    tcp.cancel = cancel;
    return ConnectTcpTransport(listener, tcp);
  };
}

NcclTransportFactory DefaultNcclTransportFactory() {
  return [](const NcclTransportOptions& nccl)
             -> absl::StatusOr<std::unique_ptr<Transport>> {
    ASSIGN_OR_RETURN(std::unique_ptr<NcclTransport> transport,
                     CreateNcclTransport(nccl));
    // The stage's kernels run on its GPU's compute stream (one per GPU
    // and process, kernels/exec_context.h): the transport orders its own
    // streams against that one.
    ASSIGN_OR_RETURN(
        std::unique_ptr<ExecContext> gpu,
        ExecContext::Create(Device::Cuda(nccl.device), Precision::kFp32));
    transport->SetComputeStream(gpu->stream());
    return std::unique_ptr<Transport>(std::move(transport));
  };
}

StageTransports::StageTransports(const WorkerOptions& options,
                                 const Device& device, TransportFactory connect,
                                 NcclTransportFactory create_nccl,
                                 ReportOutbox* outbox)
    : options_(options),
      device_(device),
      connect_(std::move(connect)),
      create_nccl_(std::move(create_nccl)),
      outbox_(outbox) {}

std::unique_ptr<RemoteRendezvous> StageTransports::ControllerRendezvous(
    const std::string& job_id) const {
  return std::make_unique<RemoteRendezvous>(
      absl::StrCat("controller ", options_.controller),
      [outbox = outbox_, job_id](const RemoteRendezvous::Request& request) {
        return outbox->SendLive(RendezvousMessage(job_id, request));
      });
}

absl::StatusOr<std::unique_ptr<Transport>> StageTransports::Connect(
    const v1::StageAssignment& assignment, int num_stages, int report_rank,
    const std::string& transport_id, ActiveJob* job) {
  const std::string& job_id = assignment.job_id();
  const int s = assignment.rank();
  if (assignment.peer_addresses_size() != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StageAssignment.peer_addresses: the job has ", num_stages,
        " stages, got ", assignment.peer_addresses_size(), " addresses"));
  }
  ASSIGN_OR_RETURN(
      const TransportChoice choice,
      ChooseAssignmentTransport(assignment, num_stages, NcclTransportBuilt()));
  if (assignment.placements_size() > 0) {
    // The other ranks chose from this placement: it must be where this
    // worker really computes.
    const std::string& mine = assignment.placements(s).device();
    absl::StatusOr<Device> placed = ParseDevice(mine);
    if (!placed.ok() || *placed != device_) {
      return absl::InvalidArgumentError(
          absl::StrCat("StageAssignment.placements[", s, "].device: \"", mine,
                       "\", but this worker runs on ", device_.ToString()));
    }
  }
  LOG(INFO) << "trainyard-worker " << options_.name << ": job " << job_id
            << " stage " << s << " transport " << TransportKindName(choice.kind)
            << ": " << choice.reason;
  outbox_->Report(TransportMessage(job_id, report_rank, choice));
  if (job->cancel_flag()->load()) return job->abort_reason().first;

  if (choice.kind == TransportKind::kNccl) {
    absl::StatusOr<std::unique_ptr<Transport>> created =
        CreateNccl(job_id, transport_id, s, num_stages, job);
    if (!created.ok()) {
      return Prefixed(created.status(),
                      "creating the NCCL transport to the other stages: ");
    }
    return created;
  }
  std::vector<std::string> peers(assignment.peer_addresses().begin(),
                                 assignment.peer_addresses().end());
  absl::StatusOr<std::unique_ptr<Transport>> connected =
      connect_(transport_id, s, peers, assignment.data_plane_secret(),
               job->cancel_flag());
  if (!connected.ok()) {
    return Prefixed(connected.status(), "connecting to the other stages: ");
  }
  return connected;
}

absl::StatusOr<std::unique_ptr<Transport>> StageTransports::CreateNccl(
    const std::string& job_id, const std::string& transport_id, int rank,
    int world_size, ActiveJob* job) {
  std::unique_ptr<RemoteRendezvous> rendezvous = ControllerRendezvous(job_id);
  job->SetRendezvous(rendezvous.get());
  NcclTransportOptions nccl;
  nccl.job_id = transport_id;
  nccl.rank = rank;
  nccl.world_size = world_size;
  nccl.device = device_.index;
  nccl.rendezvous = rendezvous.get();
  // Creation is the NCCL form of connecting to the peers: bounded like a
  // TCP connect (and never longer than a stage's wait for a neighbour), so
  // an aborted job whose creation cannot be interrupted (NCCL's own join)
  // still ends within the time the worker waits for it before refusing the
  // next assignment (worker_daemon.cc's AbortedJobWait).
  nccl.init_timeout =
      std::min(options_.stage_timeout, options_.peer_connect_timeout);
  nccl.payload_timeout = options_.stage_timeout;
  nccl.shutdown_timeout = options_.stage_timeout;
  nccl.cancel = job->cancel_flag();
  absl::StatusOr<std::unique_ptr<Transport>> created = create_nccl_(nccl);
  job->SetRendezvous(nullptr);
  return created;
}

}  // namespace trainyard
