#include "cli/job_stages.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iostream>
#include <map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "cli/connect.h"
#include "cli/job_client.h"
#include "plan/job_plan.h"
#include "proto/trainyard.pb.h"
#include "schedule/schedule.h"

namespace trainyard {
namespace {

// One stage's phase times (seconds) and counters summed over steps.
struct StageTotals {
  double forward = 0, backward = 0, comm = 0, idle = 0, optimizer = 0, loss = 0;
  double data_wait = 0;
  int64_t syncs = 0, copy_bytes = 0;
  int64_t steps = 0;
};

// Replays the job's history up to its newest completed step and sums each
// stage's timings; a watch error other than Cancelled is returned.
absl::StatusOr<std::map<int, StageTotals>> SumStageTimings(
    JobClient& client, const trainyard::v1::Job& job) {
  std::map<int, StageTotals> sums;
  const int64_t last = job.steps_completed();
  if (last <= 0) return sums;
  std::atomic<bool> stop{false};
  absl::StatusOr<trainyard::v1::JobStateChange> watched = client.Watch(
      job.job_id(), 1,
      [&](const trainyard::v1::JobEvent& e) {
        if (!e.has_step() || e.step().step() > last) return;
        for (const trainyard::v1::StageTiming& t : e.step().stages()) {
          StageTotals& s = sums[t.stage()];
          s.forward += t.forward_s();
          s.backward += t.backward_s();
          s.comm += t.comm_s();
          s.idle += t.idle_s();
          s.optimizer += t.optimizer_s();
          s.loss += t.loss_s();
          s.data_wait += t.data_wait_s();
          s.syncs += t.syncs();
          s.copy_bytes += t.h2d_bytes() + t.d2h_bytes();
          ++s.steps;
        }
        if (e.step().step() >= last) stop.store(true);
      },
      absl::Seconds(10), &stop);
  if (!watched.ok() && !absl::IsCancelled(watched.status())) {
    return watched.status();
  }
  return sums;
}

// The table of mean milliseconds per step, one row per stage, and the mean
// of the stages' bubbles.
void PrintStageTable(const std::map<int, StageTotals>& sums) {
  std::cout << absl::StrFormat(
      "%-6s %12s %11s %12s %8s %8s %13s %8s %8s %7s %6s %11s\n", "stage",
      "data_wait_ms", "forward_ms", "backward_ms", "loss_ms", "comm_ms",
      "idle_ms", "optimizer_ms", "step_ms", "bubble", "syncs", "copied_kib");
  double bubble_sum = 0;
  for (const auto& [stage, s] : sums) {
    const double n = static_cast<double>(std::max<int64_t>(1, s.steps));
    const double total = s.data_wait + s.forward + s.backward + s.loss +
                         s.comm + s.idle + s.optimizer;
    const double bubble = total > 0 ? s.idle / total : 0;
    bubble_sum += bubble;
    std::cout << absl::StrFormat(
        "%-6d %12.3f %11.3f %12.3f %8.3f %8.3f %8.3f %13.3f %8.3f %7.3f "
        "%6.1f %11.1f\n",
        stage, 1e3 * s.data_wait / n, 1e3 * s.forward / n, 1e3 * s.backward / n,
        1e3 * s.loss / n, 1e3 * s.comm / n, 1e3 * s.idle / n,
        1e3 * s.optimizer / n, 1e3 * total / n, bubble, s.syncs / n,
        s.copy_bytes / n / 1024);
  }

  if (!sums.empty()) {
    std::cout << absl::StrFormat("measured bubble (mean over stages): %.3f\n",
                                 bubble_sum / sums.size());
  }
}

// The bubble of the job's schedule with equal pass costs, when the schedule
// can be made.
void PrintScheduleBubble(const trainyard::v1::ParallelismSpec& par) {
  absl::StatusOr<Schedule> sched = MakeTrainingSchedule(
      par.schedule().empty() ? "1f1b" : par.schedule(),
      std::max(1, par.stages()),
      std::max(1, par.microbatches() / std::max(1, par.replicas())),
      par.chunks());
  absl::StatusOr<double> own = sched.ok()
                                   ? SimulatedBubble(*sched)
                                   : absl::StatusOr<double>(sched.status());
  if (own.ok()) {
    std::cout << absl::StrFormat(
        "the schedule's own bubble: %.3f (equal forward, input-gradient and "
        "weight-gradient times, free messages)\n",
        *own);
  }
}

}  // namespace

int PrintStages(JobClient& client, const trainyard::v1::Job& job) {
  absl::StatusOr<std::map<int, StageTotals>> sums =
      SumStageTimings(client, job);
  if (!sums.ok()) {
    return ReportRpcError("get --stages", client, sums.status());
  }
  absl::StatusOr<JobPlan> plan = PlanJob(job.spec(), PlanOptions::ShapeOnly());
  const auto& par =
      plan.ok() ? plan->spec.parallelism() : job.spec().parallelism();
  std::cout << absl::StrFormat(
      "job %s: %d step(s); %d stage(s), schedule %s, %d microbatch(es)\n",
      job.job_id(), job.steps_completed(), par.stages(), par.schedule(),
      par.microbatches());
  PrintStageTable(*sums);
  PrintScheduleBubble(par);
  return 0;
}

}  // namespace trainyard
