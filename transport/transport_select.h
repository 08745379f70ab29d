// Transport choice: which Transport a multi-stage job uses, decided once
// per job from where its stages run. Pure logic (no CUDA), built and tested
// everywhere; the caller passes whether this build has NCCL
// (NcclTransportBuilt() in transport/nccl_transport.h).
//
// Rule: NCCL when every stage is on a GPU, no two stages share a GPU
// (distinct (host, device) pairs; NCCL allows one rank per GPU) and the
// build has NCCL. Otherwise TCP, staging GPU tensors through host memory
// when any stage is on a GPU (or a simulated device, which never uses
// NCCL). A one-stage job needs no transport.
//
// Thread safety: pure functions.
#ifndef TRAINYARD_TRANSPORT_TRANSPORT_SELECT_H_
#define TRAINYARD_TRANSPORT_TRANSPORT_SELECT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainyard {

// Where one pipeline stage runs.
struct StagePlacement {
  std::string host;  // the worker's host name or IP, as the controller knows it
  std::string device;  // "cpu", "cuda:N" or "sim:N"
};

enum class TransportKind { kNone, kTcp, kNccl };
const char* TransportKindName(TransportKind kind);  // "none", "tcp", "nccl"

struct TransportChoice {
  TransportKind kind = TransportKind::kNone;
  // TCP only: some stage is on a GPU, so tensors are copied to host memory
  // before sending and back to the device after receiving.
  bool host_staging = false;
  // One line for the job log, e.g. "stages 1 and 2 share cuda:0 on host a:
  // using TCP with host staging".
  std::string reason;
};

// Chooses the transport for a job whose stage s runs at `stages[s]`.
// Errors (InvalidArgument, naming the stage and value): no stages, an empty
// host, a device that is not "cpu" or "cuda:N" (a bare "cuda" is rejected:
// the choice needs the GPU index).
absl::StatusOr<TransportChoice> ChooseTransport(
    const std::vector<StagePlacement>& stages, bool nccl_built);

}  // namespace trainyard

#endif  // TRAINYARD_TRANSPORT_TRANSPORT_SELECT_H_
