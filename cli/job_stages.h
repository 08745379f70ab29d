// `trainyard get JOB --stages`: per stage, the mean time of each phase over
// the job's published steps (replayed from its history), the measured
// bubble, and the schedule's own bubble (SimulatedBubble with equal forward,
// input- and weight-gradient costs).
#ifndef TRAINYARD_CLI_JOB_STAGES_H_
#define TRAINYARD_CLI_JOB_STAGES_H_

#include "cli/job_client.h"
#include "proto/trainyard.pb.h"

namespace trainyard {

// Prints the report to stdout; returns the command's exit status (0, or
// ReportRpcError's when replaying the job's steps failed).
int PrintStages(JobClient& client, const trainyard::v1::Job& job);

}  // namespace trainyard

#endif  // TRAINYARD_CLI_JOB_STAGES_H_
