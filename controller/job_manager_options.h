// JobManagerOptions: how the controller's JobManager runs (timeouts,
// limits, folders), and the planner options it derives from them.
#ifndef TRAINYARD_CONTROLLER_JOB_MANAGER_OPTIONS_H_
#define TRAINYARD_CONTROLLER_JOB_MANAGER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "controller/log_ring.h"
#include "controller/rendezvous_table.h"
#include "controller/trace_buffer.h"
#include "plan/job_plan.h"

namespace trainyard {

struct JobManagerOptions {
  std::string data_dir;  // required
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // Bounds on what workers may store in a job's rendezvous.
  RendezvousLimits rendezvous_limits;
  // After a restart, how long a RUNNING job waits for its workers to
  // reconnect and claim their stages before it is restarted instead.
  absl::Duration adopt_timeout = absl::Seconds(10);
  // How long a restarting job waits for a cancelled stage of its old gang
  // to stop before it drops that stage's worker (declared lost).
  absl::Duration drain_timeout = absl::Seconds(10);
  // The workers' data folder (their --data_dir) as paths in specs name it;
  // when set, SubmitJob refuses a spec with a path that leaves it
  // (PlanOptions::confine_to), before any worker sees the spec.
  std::string job_data_dir;
  // Where the workers' task plugins are (the same lib<name>.so files):
  // when set, SubmitJob also asks the plugin to check task.config
  // (validate_config, which opens no files), so a bad config is refused at
  // submit rather than when the job starts. Runs the plugins' code in the
  // controller: point it only at trusted plugins. Empty = the workers check.
  std::string plugin_dir;
  // Per job: step traces and log lines kept in memory.
  TraceLimits trace_limits;
  LogRingLimits log_limits;
  // Log lines taken from one worker: a token bucket of this rate and
  // burst; lines beyond it are dropped and counted (a notice line says so
  // with the worker's next line taken).
  double log_lines_per_second = 200;
  double log_burst = 1000;
  // Ended jobs whose traces, log lines and in-memory events are still kept
  // (the newest ended; at least 1); older ones' are dropped (their events
  // stay in the store).
  int keep_ended_jobs = 16;
  // Per job: the newest events held in memory for WatchJob; older ones are
  // read from the store (controller/job_event_log.h).
  int64_t events_in_memory = 4096;
};

// How the controller plans a job's spec: its shape only (the workers check
// files and memory), with relative paths resolved against, and confined
// to, `options.job_data_dir` when it is set.
PlanOptions ControllerPlanOptions(const JobManagerOptions& options);

}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_JOB_MANAGER_OPTIONS_H_
