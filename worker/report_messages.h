// The messages a worker sends the controller about the stage it runs
// (proto/trainyard.proto's WorkerMessage): the engine's reports
// (engine/stage.h's StepReport and EvalReport) and the stage's start,
// transport, held state and end, as wire messages; and its heartbeats and
// rendezvous requests.
#ifndef TRAINYARD_WORKER_REPORT_MESSAGES_H_
#define TRAINYARD_WORKER_REPORT_MESSAGES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/forward_job.h"
#include "engine/stage.h"
#include "proto/trainyard.pb.h"
#include "transport/rendezvous.h"
#include "transport/transport_select.h"

namespace trainyard {

// StageStep: step `r` of gang rank `stage`, its timings, device traffic and
// span trace; samples_per_sec from `step_seconds`.
v1::WorkerMessage StepMessage(const std::string& job_id, int stage,
                              const StepReport& r, double step_seconds);

// StageEval: the eval pass after `step` (its span, when timed, as the
// trace).
v1::WorkerMessage EvalMessage(const std::string& job_id, int stage,
                              int64_t step, const EvalReport& r);

// StageDone: how the stage ended (`status`'s code), `error` for people, and
// whether it was cancelled.
v1::WorkerMessage DoneMessage(const std::string& job_id, int stage,
                              const absl::Status& status,
                              const std::string& error, bool cancelled);

// StageStarted: the step the stage resumed at (0: a fresh start).
v1::WorkerMessage StartedMessage(const std::string& job_id, int stage,
                                 int64_t resume_step);

// StageTransport: the transport the stage chose, and why.
v1::WorkerMessage TransportMessage(const std::string& job_id, int stage,
                                   const TransportChoice& choice);

// StateHeld: this worker holds stage `stage`'s snapshot after `step`, or
// (stage -1) the job's checkpoint after `step` is committed.
v1::WorkerMessage HeldMessage(const std::string& job_id, int stage,
                              int64_t step);

// StageShardReport: rank `stage` wrote output shard `shard` (-1: its run
// starts), and what the job's output folder holds now.
v1::WorkerMessage ShardMessage(const std::string& job_id, int stage,
                               int64_t shard, const OutputProgress& p);

// A heartbeat stamped now; `draining` says the worker takes no new stage.
v1::WorkerMessage HeartbeatMessage(bool draining);

// RendezvousPut or RendezvousGet: `request` to the job's store at the
// controller.
v1::WorkerMessage RendezvousMessage(const std::string& job_id,
                                    const RemoteRendezvous::Request& request);

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_REPORT_MESSAGES_H_
