#include "cli/schedule_command.h"

#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "cli/cli_flags.h"
#include "cli/connect.h"
#include "cli/job_client.h"
#include "cli/pass_costs.h"
#include "proto/trainyard.pb.h"
#include "schedule/schedule.h"
#include "schedule/schedule_timeline.h"

namespace trainyard {
namespace {

// --costs_from JOB: the costs of the job's newest traced step (GetTrace at
// --controller). Returns 0 and sets *costs, or prints why not and returns
// the exit status.
int CostsFromJob(const CliFlags& flags, PassCosts* costs) {
  const std::string& job_id = flags.costs_from;
  std::unique_ptr<JobClient> client = Connect("schedule", flags);
  if (client == nullptr) return 2;
  auto trace = client->GetTrace(job_id, 0);
  if (!trace.ok()) return ReportRpcError("schedule", *client, trace.status());
  std::optional<PassCosts> mean = MeanPassCosts(*trace);
  if (!mean.has_value()) {
    std::cerr << "trainyard schedule: --costs_from " << job_id << ": step "
              << trace->step()
              << " has no forward, input- and weight-gradient spans\n";
    return 1;
  }
  *costs = *mean;
  std::cout << absl::StrFormat(
      "costs from %s step %d (mean per microbatch over %d stage(s)): "
      "F %.3f ms, B %.3f ms, W %.3f ms\n",
      job_id, trace->step(), trace->stages_size(), costs->forward,
      costs->backward_input, costs->backward_weight);
  return 0;
}

// The schedule's shape, chunk layout and costs, then its actions and text
// timeline (`width` columns).
void PrintSchedule(const Schedule& sched, const ScheduleSimulation& sim,
                   const PassCosts& costs, int width) {
  const int S = sched.num_stages;
  const int v = sched.num_chunks;
  std::cout << absl::StrFormat(
      "schedule %s: %d stage(s), %d microbatch(es), %d chunk(s) per stage",
      sched.name, S, sched.num_microbatches, v);
  if (v > 1 && sched.layout == ChunkLayout::kV) {
    std::cout << absl::StrFormat(
        " (V: stage s holds virtual stages s and %d-s; loss on stage 0 "
        "chunk 1)",
        2 * S - 1);
  } else if (v > 1) {
    std::cout << absl::StrFormat(
        " (loop: chunk c of stage s is virtual stage c*%d+s)", S);
  }
  std::cout << absl::StrFormat(
      "\ncosts per microbatch on a whole stage: forward %g, input gradient "
      "%g, weight gradient %g",
      costs.forward, costs.backward_input, costs.backward_weight);
  if (v > 1) std::cout << absl::StrFormat(" (a chunk pass: 1/%d of that)", v);
  std::cout << "\nvalid: every send received, no deadlock, weight gradients "
               "in ascending microbatch order per chunk\n\nactions:\n"
            << sched.ToString() << "\ntimeline:\n"
            << RenderTextTimeline(sched, sim, width) << "\n";
}

// Per stage: busy and idle time, bubble and peak activations; then the
// step's makespan and bubble.
void PrintStageTable(const Schedule& sched, const ScheduleSimulation& sim) {
  std::cout << absl::StrFormat("%-6s %8s %8s %8s %16s\n", "stage", "busy",
                               "idle", "bubble", "peak_in_flight");
  for (int s = 0; s < sched.num_stages; ++s) {
    std::string peak = absl::StrFormat("%.4g", sim.peak_in_flight[s]);
    if (sched.num_chunks > 1) {
      absl::StrAppendFormat(&peak, " (%d chunks)",
                            sim.peak_chunk_activations[s]);
    }
    std::cout << absl::StrFormat(
        "%-6d %8g %8g %8.4f %16s\n", s, sim.busy[s], sim.idle[s],
        sim.makespan > 0 ? sim.idle[s] / sim.makespan : 0.0, peak);
  }
  std::cout << absl::StrFormat(
      "step %g; bubble %.4f of the step (idle / (idle + busy), mean over "
      "stages), %.4f of compute (idle / busy)\n"
      "peak_in_flight: microbatches whose activations a stage holds at once "
      "(forward to weight pass), in whole-stage microbatches\n",
      sim.makespan, sim.bubble, sim.bubble_of_compute);
}

// --svg: the timeline drawn as SVG; 1 when the file cannot be written.
int WriteSvg(const std::string& svg, const Schedule& sched,
             const ScheduleSimulation& sim) {
  std::ofstream f(svg, std::ios::binary | std::ios::trunc);
  f << RenderSvgTimeline(sched, sim);
  f.close();
  if (!f) {
    std::cerr << "trainyard schedule: --svg: cannot write " << svg << "\n";
    return 1;
  }
  std::cerr << "trainyard schedule: wrote " << svg << "\n";
  return 0;
}

}  // namespace

int ScheduleCommand(const CliFlags& flags) {
  const int S = flags.stages;
  const int M = flags.microbatches;
  if (S < 1 || M < 1) {
    std::cerr << "usage: trainyard schedule --stages S --microbatches M "
                 "--schedule NAME [--chunks V] [--costs F,B,W] [--svg FILE] "
                 "[--width N]\n"
                 "trainyard schedule: --stages and --microbatches must be "
                 ">= 1, got "
              << S << " and " << M << "\n";
    return 2;
  }
  PassCosts costs;
  if (!flags.costs_from.empty()) {
    if (int rc = CostsFromJob(flags, &costs); rc != 0) return rc;
  } else if (std::optional<PassCosts> parsed = ParseCosts(flags.costs)) {
    costs = *parsed;
  } else {
    std::cerr << "trainyard schedule: --costs: expected F,B,W, three "
                 "finite times >= 0 (not all 0), got \""
              << flags.costs << "\"\n";
    return 2;
  }
  absl::StatusOr<Schedule> sched =
      MakeTrainingSchedule(flags.schedule, S, M, flags.chunks, costs);
  if (!sched.ok()) {
    std::cerr << "trainyard schedule: " << sched.status().message() << "\n";
    return 2;
  }
  if (absl::Status valid = ValidateSchedule(*sched); !valid.ok()) {
    std::cerr << "trainyard schedule: " << valid.message() << "\n";
    return 1;
  }
  absl::StatusOr<ScheduleSimulation> sim = SimulateSchedule(*sched, costs);
  if (!sim.ok()) {
    std::cerr << "trainyard schedule: " << sim.status().message() << "\n";
    return 1;
  }
  PrintSchedule(*sched, *sim, costs, flags.width);
  PrintStageTable(*sched, *sim);
  if (!flags.svg.empty()) return WriteSvg(flags.svg, *sched, *sim);
  return 0;
}

}  // namespace trainyard
