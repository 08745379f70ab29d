// Pipeline bubbles from measured costs, and the replicas' reduction cost
// (figures in docs/BENCHMARKS.md):
//
//   bazel run //engine:bubble_benchmark
//
// 1. Runs one pipeline stage's worth of model (one block, h = 512,
//    ffn = 2048, GELU; what each of 4 stages holds in the 4-block model)
//    for 8 microbatches of 32 rows, and takes the mean forward (F),
//    input-gradient (B) and weight-gradient (W) times per microbatch from
//    the stage's own spans. With those costs it simulates every schedule at
//    p = 4, m = 8 (schedule/schedule.h, messages free) and prints the bubble
//    next to the zero-bubble paper's theory. (Four stages cannot each get a
//    core on a 2-core machine: measured costs, then simulation, is what the
//    issue allows.)
// 2. Runs the 4-block model as 2 stages, each a thread with a core of its
//    own, under every schedule (interleaved and zbv with 2 chunks per
//    stage), and prints the measured idle share of each stage's step next
//    to the schedule simulated with the F, B, W costs of that same run.
// 3. Runs the 4-block model on one stage with R = 1 and R = 2 replicas
//    (threads, 1 BLAS thread each) and reports the time of the replicas'
//    gradient sum (Gloo reduce-scatter in tree order + all-gather) against
//    the step.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "engine/local_job.h"
#include "engine/task_loader.h"
#include "glog/logging.h"
#include "kernels/blas.h"
#include "plan/job_plan.h"
#include "schedule/schedule.h"

namespace trainyard {
namespace {

trainyard::v1::JobSpec Spec(int blocks, int steps, int microbatches,
                            int replicas) {
  trainyard::v1::JobSpec spec;
  spec.set_name("bubble");
  spec.set_steps(steps);
  spec.set_seed(1);
  for (int i = 0; i < blocks; ++i) {
    auto* b = spec.mutable_model()->add_blocks();
    b->set_out_features(512);
    b->set_ffn_hidden_size(2048);
  }
  spec.mutable_parallelism()->set_microbatches(microbatches);
  spec.mutable_parallelism()->set_replicas(replicas);
  spec.mutable_parallelism()->set_accumulation("tree");
  spec.mutable_optimizer()->set_lr(1e-4);
  spec.mutable_task()->set_plugin("mse");
  auto* syn = spec.mutable_data()->mutable_train()->mutable_synthetic();
  syn->set_kind("teacher_regression");
  syn->set_num_samples(1024);
  syn->set_num_features(512);
  syn->set_num_outputs(512);
  syn->set_noise(0.1);
  spec.mutable_data()->set_batch_size(32 * microbatches);
  return spec;
}

JobPlan Plan(const trainyard::v1::JobSpec& spec) {
  PlanOptions options;
  absl::StatusOr<JobPlan> plan = PlanJob(spec, options);
  CHECK(plan.ok()) << plan.status();
  return *plan;
}

void MeasuredBubbles() {
  const int kSteps = 12, kWarmup = 2;
  std::map<SpanKind, double> total_us;
  std::map<SpanKind, int> count;
  LocalJobOptions options;
  options.plugin_dir = DefaultPluginDir();
  options.on_step = [&](const StepReport& r, double) {
    if (r.step <= kWarmup) return;
    for (const Span& s : r.trace.spans) {
      total_us[s.kind] += static_cast<double>(s.end_us - s.start_us);
      ++count[s.kind];
    }
  };
  absl::Status st = RunLocalJob(Plan(Spec(1, kSteps, 8, 1)), options);
  CHECK(st.ok()) << st;
  auto mean_ms = [&](SpanKind k) { return total_us[k] / count[k] / 1e3; };
  const double f = mean_ms(v1::SPAN_FORWARD);
  const double b = mean_ms(v1::SPAN_BACKWARD_INPUT);
  const double w = mean_ms(v1::SPAN_BACKWARD_WEIGHT);
  std::printf(
      "measured per microbatch (one block h=512 ffn=2048, 32 rows, %d "
      "steps): F %.3f ms, B %.3f ms, W %.3f ms\n",
      kSteps - kWarmup, f, b, w);
  std::printf("%-16s %10s %12s %12s   %s\n", "schedule p=4 m=8", "step ms",
              "bubble/step", "of compute", "theory (unit costs, paper)");
  struct Row {
    const char* name;
    int chunks;
    const char* theory;
  };
  for (Row row :
       {Row{"gpipe", 1, "27% (unsplit backward)"},
        Row{"1f1b", 1, "27% (unsplit backward)"},
        Row{"zbh1", 1, "~12.5% of compute"}, Row{"interleaved", 2, "~13.6%"},
        Row{"zbv", 2, "~0 + communication"}}) {
    absl::StatusOr<Schedule> s =
        // zbv orders its passes for the measured costs.
        MakeTrainingSchedule(row.name, 4, 8, row.chunks, PassCosts{f, b, w});
    CHECK(s.ok()) << s.status();
    absl::StatusOr<ScheduleSimulation> sim =
        SimulateSchedule(*s, PassCosts{f, b, w});
    CHECK(sim.ok()) << sim.status();
    std::printf("%-16s %10.3f %11.1f%% %11.1f%%   %s\n",
                absl::StrFormat(
                    "%s%s", row.name,
                    row.chunks > 1 ? absl::StrFormat(" v=%d", row.chunks) : "")
                    .c_str(),
                sim->makespan, 100 * sim->bubble, 100 * sim->bubble_of_compute,
                row.theory);
  }
}

// Real 2-stage runs: each stage a thread with a core of its own (1 BLAS
// thread), so their idle time is the schedule's bubble plus messages. Next
// to each, the same schedule simulated with the costs measured in that run.
void RealTwoStageBubbles() {
  const int kSteps = 12, kWarmup = 2, kStages = 2, kMicrobatches = 8;
  std::printf(
      "\nreal runs, p=2 m=8 (4 blocks h=512 ffn=2048, 32 rows per "
      "microbatch, stages as threads with 1 BLAS thread each, %d steps):\n",
      kSteps - kWarmup);
  std::printf("%-16s %9s %12s %12s %12s   %s\n", "schedule", "step ms",
              "idle/step", "simulated", "sim compute", "measured F/B/W ms");
  for (const char* name : {"gpipe", "1f1b", "zbh1", "interleaved", "zbv"}) {
    absl::Mutex mu;
    double step_s[kStages] = {}, idle_s[kStages] = {};
    std::map<SpanKind, double> total_us;
    int steps = 0;
    LocalJobOptions options;
    options.plugin_dir = DefaultPluginDir();
    options.threads = 1;
    options.on_stage_step = [&](int, int stage, const StepReport& r,
                                double seconds) {
      if (r.step <= kWarmup) return;
      absl::MutexLock lock(&mu);
      step_s[stage] += seconds;
      idle_s[stage] += r.times.idle;
      for (const Span& span : r.trace.spans) {
        total_us[span.kind] += static_cast<double>(span.end_us - span.start_us);
      }
      if (stage == 0) ++steps;
    };
    trainyard::v1::JobSpec spec = Spec(4, kSteps, kMicrobatches, 1);
    spec.mutable_parallelism()->set_stages(kStages);
    spec.mutable_parallelism()->set_schedule(name);
    const JobPlan plan = Plan(spec);
    absl::Status st = RunLocalJob(plan, options);
    CHECK(st.ok()) << st;
    // Whole-stage costs per microbatch, mean over the stages.
    const double per = 1e3 * steps * kStages * kMicrobatches;
    const PassCosts costs{total_us[v1::SPAN_FORWARD] / per,
                          total_us[v1::SPAN_BACKWARD_INPUT] / per,
                          total_us[v1::SPAN_BACKWARD_WEIGHT] / per};
    absl::StatusOr<Schedule> sched =
        MakeTrainingSchedule(name, kStages, kMicrobatches, plan.num_chunks);
    CHECK(sched.ok()) << sched.status();
    absl::StatusOr<ScheduleSimulation> sim = SimulateSchedule(*sched, costs);
    CHECK(sim.ok()) << sim.status();
    double bubble = 0, step_ms = 0;
    for (int k = 0; k < kStages; ++k) {
      bubble += idle_s[k] / step_s[k] / kStages;
      step_ms += 1e3 * step_s[k] / steps / kStages;
    }
    std::printf("%-16s %9.2f %11.1f%% %11.1f%% %11.1f%%   %.3f/%.3f/%.3f\n",
                absl::StrFormat("%s%s", name,
                                plan.num_chunks > 1
                                    ? absl::StrFormat(" v=%d", plan.num_chunks)
                                    : "")
                    .c_str(),
                step_ms, 100 * bubble, 100 * sim->bubble,
                100 * sim->bubble_of_compute, costs.forward,
                costs.backward_input, costs.backward_weight);
  }
}

void ReplicaOverhead() {
  const int kSteps = 8, kWarmup = 2;
  for (int replicas : {1, 2}) {
    double step_s = 0, comm_s = 0;
    int n = 0;
    LocalJobOptions options;
    options.plugin_dir = DefaultPluginDir();
    options.threads = 1;  // per process: the replicas share the 2 cores
    options.on_step = [&](const StepReport& r, double seconds) {
      if (r.step <= kWarmup) return;
      step_s += seconds;
      comm_s += r.times.comm;
      ++n;
    };
    absl::Status st = RunLocalJob(Plan(Spec(4, kSteps, 8, replicas)), options);
    CHECK(st.ok()) << st;
    std::printf(
        "R=%d (4 blocks h=512 ffn=2048, 8.4 M parameters, batch 256, M=8, "
        "1 stage): step %.1f ms, replica gradient sum %.1f ms (%.1f%% of "
        "the step)\n",
        replicas, 1e3 * step_s / n, 1e3 * comm_s / n, 100 * comm_s / step_s);
  }
}

}  // namespace
}  // namespace trainyard

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  trainyard::MeasuredBubbles();
  trainyard::RealTwoStageBubbles();
  trainyard::ReplicaOverhead();
  return 0;
}
