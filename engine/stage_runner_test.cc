// RunStage with every stage of a job as a thread over the in-process
// transport: the per-step span traces the stages report, held messages,
// and the checkpoints a cancelled stage leaves.
#include "engine/stage_runner.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "engine/checkpoint_store.h"
#include "engine/test_jobs.h"
#include "engine/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/job_plan.h"
#include "schedule/schedule.h"
#include "transport/in_process_transport.h"

namespace trainyard {
namespace {

struct StageRun {
  std::vector<StepReport> steps;
  std::vector<double> step_seconds;
  std::map<int64_t, EvalReport> evals;  // by the step they follow
};

// Runs `plan` with one thread per stage; returns what each stage reported.
std::vector<StageRun> RunAllStages(const JobPlan& plan,
                                   StageOptions options = StageOptions()) {
  const int S = plan.num_stages();
  InProcessHub hub(S);
  options.plugin_dir = testing::PluginDir();
  options.timeout = absl::Seconds(30);
  std::vector<std::unique_ptr<Stage>> stages;
  for (int s = 0; s < S; ++s) {
    absl::StatusOr<StartedStage> started =
        StartStage(plan, s, hub.rank(s), options);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return {};
    stages.push_back(std::move(started->stage));
  }
  std::vector<StageRun> runs(S);
  std::vector<std::thread> threads;
  for (int s = 0; s < S; ++s) {
    threads.emplace_back([&, s] {
      StageRunOptions run;
      run.timeout = absl::Seconds(30);
      run.on_step = [&, s](const StepReport& r, double seconds) {
        runs[s].steps.push_back(r);
        runs[s].step_seconds.push_back(seconds);
      };
      run.on_eval = [&, s](int64_t step, const EvalReport& r) {
        runs[s].evals[step] = r;
      };
      absl::Status st = RunStage(*stages[s], hub.rank(s), plan, run);
      EXPECT_TRUE(st.ok()) << "stage " << s << ": " << st;
      if (!st.ok()) hub.rank(s)->Abort(st);
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

// The spans a stage's schedule should produce, in order: one per action
// (a receive is the wait for its message; the last stage's forward is
// followed by its loss), the optimizer step as its three parts, and the
// wait for the batch's rows and its preparation first on the first stage.
std::vector<std::pair<SpanKind, int>> ExpectedSpans(const Schedule& schedule,
                                                    int stage) {
  std::vector<std::pair<SpanKind, int>> out;
  if (stage == 0) {
    out.push_back({v1::SPAN_DATA_WAIT, -1});
    out.push_back({v1::SPAN_PREPARE_BATCH, -1});
  }
  const bool last = stage == schedule.num_stages - 1;
  for (const Action& a : schedule.stages[stage]) {
    switch (a.kind) {
      case ActionKind::kForward:
        out.push_back({v1::SPAN_FORWARD, a.microbatch});
        if (last) out.push_back({v1::SPAN_LOSS, a.microbatch});
        break;
      case ActionKind::kBackwardInput:
        out.push_back({v1::SPAN_BACKWARD_INPUT, a.microbatch});
        break;
      case ActionKind::kBackwardWeight:
        out.push_back({v1::SPAN_BACKWARD_WEIGHT, a.microbatch});
        break;
      case ActionKind::kSendActivation:
        out.push_back({v1::SPAN_SEND_ACTIVATION, a.microbatch});
        break;
      case ActionKind::kRecvActivation:
        out.push_back({v1::SPAN_RECV_ACTIVATION, a.microbatch});
        break;
      case ActionKind::kSendGradient:
        out.push_back({v1::SPAN_SEND_GRADIENT, a.microbatch});
        break;
      case ActionKind::kRecvGradient:
        out.push_back({v1::SPAN_RECV_GRADIENT, a.microbatch});
        break;
      case ActionKind::kOptimizerStep:
        out.push_back({v1::SPAN_OPTIMIZER, -1});
        out.push_back({v1::SPAN_ALL_REDUCE, -1});
        out.push_back({v1::SPAN_OPTIMIZER, -1});
        break;
    }
  }
  return out;
}

// Microseconds of `trace` spent in spans of these kinds.
int64_t SpanMicros(const StepTrace& trace, std::vector<SpanKind> kinds) {
  int64_t total = 0;
  for (const Span& s : trace.spans) {
    for (SpanKind k : kinds) {
      if (s.kind == k) total += s.end_us - s.start_us;
    }
  }
  return total;
}

class StageTraceTest : public ::testing::TestWithParam<const char*> {};

TEST_P(StageTraceTest, SpansCoverEveryActionInOrderWithinTheStep) {
  const int kStages = 3, kMicrobatches = 4, kSteps = 4;
  v1::JobSpec spec = testing::WithPipeline(testing::ClassificationSpec(),
                                           kStages, kMicrobatches, GetParam());
  spec.set_steps(kSteps);
  spec.mutable_optimizer()->clear_schedule();
  spec.mutable_data()->set_eval_every(2);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, PlanOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<Schedule> schedule =
      MakeTrainingSchedule(GetParam(), kStages, kMicrobatches);
  ASSERT_TRUE(schedule.ok());

  std::vector<StageRun> runs = RunAllStages(*plan);
  ASSERT_EQ(runs.size(), static_cast<size_t>(kStages));
  for (int s = 0; s < kStages; ++s) {
    SCOPED_TRACE(absl::StrCat("stage ", s));
    ASSERT_EQ(runs[s].steps.size(), static_cast<size_t>(kSteps));
    const std::vector<std::pair<SpanKind, int>> expected =
        ExpectedSpans(*schedule, s);
    for (size_t i = 0; i < runs[s].steps.size(); ++i) {
      const StepReport& r = runs[s].steps[i];
      const StepTrace& t = r.trace;
      SCOPED_TRACE(absl::StrCat("step ", r.step));
      EXPECT_FALSE(t.truncated);
      ASSERT_EQ(t.spans.size(), expected.size());
      int64_t previous_end = 0;
      for (size_t k = 0; k < t.spans.size(); ++k) {
        const Span& span = t.spans[k];
        EXPECT_EQ(span.kind, expected[k].first) << "span " << k;
        EXPECT_EQ(span.microbatch, expected[k].second) << "span " << k;
        // In order, one after another, inside the step.
        EXPECT_GE(span.start_us, previous_end) << "span " << k;
        EXPECT_GE(span.end_us, span.start_us) << "span " << k;
        previous_end = span.end_us;
      }
      EXPECT_LE(previous_end, t.step_us);
      // RunStage's step time starts a little before RunStep (other clock:
      // a millisecond of slack).
      EXPECT_LE(t.step_us, runs[s].step_seconds[i] * 1e6 + 1000);
      // The spans are the phases' own measurements: they add up the same
      // (each span is cut to whole microseconds).
      const int64_t n = static_cast<int64_t>(t.spans.size());
      EXPECT_NEAR(SpanMicros(t, {v1::SPAN_FORWARD}), r.times.forward * 1e6,
                  n + 1);
      EXPECT_NEAR(
          SpanMicros(t, {v1::SPAN_BACKWARD_INPUT, v1::SPAN_BACKWARD_WEIGHT}),
          r.times.backward * 1e6, n + 1);
      EXPECT_NEAR(
          SpanMicros(t, {v1::SPAN_RECV_ACTIVATION, v1::SPAN_RECV_GRADIENT}),
          r.times.idle * 1e6, n + 1);
      EXPECT_NEAR(SpanMicros(t, {v1::SPAN_OPTIMIZER}), r.times.optimizer * 1e6,
                  n + 1);
    }
    // The eval after steps 2 and 4, as one span after that step's end.
    ASSERT_EQ(runs[s].evals.size(), 2u);
    for (const auto& [step, eval] : runs[s].evals) {
      ASSERT_TRUE(eval.span.has_value()) << "eval after step " << step;
      EXPECT_EQ(eval.span->kind, v1::SPAN_EVAL);
      EXPECT_GE(eval.span->start_us, runs[s].steps[step - 1].trace.step_us);
      EXPECT_GT(eval.span->end_us, eval.span->start_us);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, StageTraceTest,
                         ::testing::Values("gpipe", "1f1b", "zbh1"));

// A stage receives from one neighbour messages for several chunks, in the
// sender's order. This hand-made schedule (interleaved layout, S = 2, v = 2,
// M = 2; valid, but not a generator's) has stage 0 send chunk 0's two
// activations before chunk 1's first, while stage 1 receives chunk 1's
// first in between: the runner must hold the early message, and the job's
// bits must not change.
Schedule ParseSchedule(const std::vector<std::string>& stages) {
  Schedule sched;
  sched.name = "held";
  sched.num_stages = static_cast<int>(stages.size());
  sched.num_microbatches = 2;
  sched.num_chunks = 2;
  sched.layout = ChunkLayout::kLoop;
  for (const std::string& line : stages) {
    std::vector<Action> acts;
    for (absl::string_view tok : absl::StrSplit(line, ' ')) {
      if (tok == "OPT") {
        acts.push_back({ActionKind::kOptimizerStep, -1});
        continue;
      }
      ActionKind kind;
      if (absl::ConsumePrefix(&tok, ">A")) {
        kind = ActionKind::kSendActivation;
      } else if (absl::ConsumePrefix(&tok, "<A")) {
        kind = ActionKind::kRecvActivation;
      } else if (absl::ConsumePrefix(&tok, ">G")) {
        kind = ActionKind::kSendGradient;
      } else if (absl::ConsumePrefix(&tok, "<G")) {
        kind = ActionKind::kRecvGradient;
      } else if (absl::ConsumePrefix(&tok, "F")) {
        kind = ActionKind::kForward;
      } else if (absl::ConsumePrefix(&tok, "B")) {
        kind = ActionKind::kBackwardInput;
      } else {
        EXPECT_TRUE(absl::ConsumePrefix(&tok, "W")) << tok;
        kind = ActionKind::kBackwardWeight;
      }
      // "<mb>.<chunk>"
      acts.push_back({kind, tok[0] - '0', tok[2] - '0'});
    }
    sched.stages.push_back(acts);
  }
  return sched;
}

TEST(StageRunnerTest, MessagesThatArriveBeforeTheirReceiveAreHeld) {
  v1::JobSpec spec =
      testing::WithPipeline(testing::ClassificationSpec(), 2, 2, "interleaved");
  spec.set_steps(4);
  spec.mutable_optimizer()->clear_schedule();
  absl::StatusOr<JobPlan> plan = PlanJob(spec, PlanOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Schedule held = ParseSchedule({
      "F0.0 >A0.0 F1.0 >A1.0 <A0.1 F0.1 >A0.1 <A1.1 F1.1 >A1.1 <G0.1 B0.1 "
      ">G0.1 <G1.1 B1.1 >G1.1 <G0.0 B0.0 <G1.0 B1.0 W0.0 W1.0 W0.1 W1.1 OPT",
      "<A0.0 F0.0 >A0.0 <A0.1 F0.1 B0.1 >G0.1 <A1.0 F1.0 >A1.0 <A1.1 F1.1 "
      "B1.1 >G1.1 <G0.0 B0.0 >G0.0 <G1.0 B1.0 >G1.0 W0.0 W1.0 W0.1 W1.1 OPT",
  });
  ASSERT_TRUE(ValidateSchedule(held).ok()) << ValidateSchedule(held);
  StageOptions options;
  options.schedule = held;
  std::vector<StageRun> got = RunAllStages(*plan, options);
  std::vector<StageRun> want = RunAllStages(*plan);
  ASSERT_EQ(got.size(), 2u);
  ASSERT_EQ(want.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(got[s].steps.size(), 4u);
    ASSERT_EQ(want[s].steps.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(got[s].steps[i].loss, want[s].steps[i].loss) << i;
      EXPECT_EQ(got[s].steps[i].grad_norm, want[s].steps[i].grad_norm) << i;
    }
  }
  // Stage 1 ran the hand-made order (its spans say so): chunk 1's forward
  // of microbatch 0 before chunk 0's of microbatch 1.
  const StepTrace& trace = got[1].steps[0].trace;
  std::vector<int> forwards;
  for (const Span& span : trace.spans) {
    if (span.kind == v1::SPAN_FORWARD) forwards.push_back(span.microbatch);
  }
  EXPECT_EQ(forwards, (std::vector<int>{0, 0, 1, 1}));

  // A schedule for another shape is refused, naming both.
  Schedule one_chunk = MakeOneFOneBSchedule(2, 2);
  options.schedule = one_chunk;
  InProcessHub hub(2);
  absl::StatusOr<StartedStage> refused =
      StartStage(*plan, 0, hub.rank(0), options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("schedule \"1f1b\" is for 2 stages, 2 "
                                   "microbatches and 1 chunks"));
}

// A stage cancelled right after it queued a commit (every file of that
// checkpoint on disk) still commits it before RunStage returns; the next
// checkpoint, whose file was only queued, stays uncommitted. Checkpoint 2's
// write is held until step 4 has run, so that step 4 finishes it at once
// (wait, commit queued, checkpoint 4's write queued), and the job is
// cancelled after step 4.
TEST(StageRunnerTest, CancelledStageKeepsTheCheckpointItQueuedACommitFor) {
  const std::string dir = ::testing::TempDir() + "/cancel_after_queue";
  std::filesystem::remove_all(dir);
  v1::JobSpec spec = testing::ClassificationSpec();
  spec.set_steps(10);
  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_every(2);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, PlanOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  InProcessHub hub(1);
  StageOptions options;
  options.plugin_dir = testing::PluginDir();
  absl::StatusOr<StartedStage> started =
      StartStage(*plan, 0, hub.rank(0), options);
  ASSERT_TRUE(started.ok()) << started.status();
  std::atomic<bool> cancel{false};
  std::atomic<int> files{0};
  absl::Notification step_4_done;
  std::vector<int64_t> committed;  // from the writer's thread, one at a time
  StageRunOptions run;
  run.cancel = &cancel;
  // on_step comes before the checkpoint due after the step is handled.
  run.on_step = [&](const StepReport& r, double) {
    if (r.step != 4) return;
    cancel.store(true);
    step_4_done.Notify();
  };
  run.on_checkpoint_file = [&](double) {
    if (files.fetch_add(1) == 0) step_4_done.WaitForNotification();
  };
  run.on_checkpoint = [&](int64_t step, const std::string&) {
    committed.push_back(step);
  };
  absl::Status st = RunStage(*started->stage, hub.rank(0), *plan, run);
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_EQ(files.load(), 2);
  EXPECT_EQ(committed, (std::vector<int64_t>{2}));
  EXPECT_TRUE(
      std::filesystem::exists(CheckpointStepDir(dir, 2) + "/manifest.json"));
  EXPECT_TRUE(std::filesystem::exists(CheckpointStepDir(dir, 4) +
                                      "/stage_0.safetensors"));
  EXPECT_FALSE(
      std::filesystem::exists(CheckpointStepDir(dir, 4) + "/manifest.json"));
  absl::StatusOr<std::optional<int64_t>> latest = LatestCheckpoint(dir);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, std::optional<int64_t>(2));
}

}  // namespace
}  // namespace trainyard
