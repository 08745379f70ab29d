#include "schedule/schedule.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

std::string Stage(const Schedule& s, int stage) {
  std::string out;
  for (const Action& a : s.stages[stage]) {
    if (!out.empty()) out += " ";
    out += ActionToString(a);
  }
  return out;
}

TEST(ScheduleTest, SimulatedBubbleMatchesTheTextbookFormula) {
  for (int S : {1, 2, 4, 8}) {
    for (int M : {1, 4, 16}) {
      const double expected = static_cast<double>(S - 1) / (M + S - 1);
      for (const Schedule& sched :
           {MakeGPipeSchedule(S, M), MakeOneFOneBSchedule(S, M)}) {
        // An unsplit backward: the textbook bubble.
        auto bubble = SimulatedBubble(sched, 1, 2, 0);
        ASSERT_TRUE(bubble.ok()) << bubble.status();
        EXPECT_NEAR(*bubble, expected, 1e-12)
            << sched.name << " S=" << S << " M=" << M;
        // Sending the input gradient before the weight gradient helps.
        auto split = SimulatedBubble(sched);
        ASSERT_TRUE(split.ok());
        EXPECT_LE(*split, expected + 1e-12) << sched.name;
        if (S > 1) {
          EXPECT_LT(*split, expected) << sched.name;
        }
      }
      // zbh1 moves weight passes into idle time: at equal costs never
      // more bubble than 1F1B, and the zero-bubble paper's ZB-H1 step of
      // 3M + S - 1 passes.
      Schedule zbh1 = MakeZeroBubbleH1Schedule(S, M);
      auto zb = SimulateSchedule(zbh1, PassCosts{1, 1, 1});
      ASSERT_TRUE(zb.ok()) << zb.status();
      EXPECT_LE(zb->bubble,
                *SimulatedBubble(MakeOneFOneBSchedule(S, M)) + 1e-12)
          << "S=" << S << " M=" << M;
      if (M >= S) {  // with fewer microbatches the pipeline never fills
        EXPECT_NEAR(zb->makespan, 3 * M + S - 1, 1e-9)
            << "S=" << S << " M=" << M;
      }
    }
  }
  // S = 2, M = 1, split backward: stage 1 sends its input gradient after
  // F, BI (t = 3); stage 0 ends at 5, each stage busy 3: idle 2/5.
  EXPECT_NEAR(*SimulatedBubble(MakeOneFOneBSchedule(2, 1)), 0.4, 1e-12);
}

TEST(ScheduleTest, OneFOneBShape) {
  Schedule s = MakeOneFOneBSchedule(2, 3);
  EXPECT_EQ(Stage(s, 0),
            "F0 >A0 F1 >A1 <G0 B0 W0 F2 >A2 <G1 B1 W1 <G2 B2 W2 OPT");
  EXPECT_EQ(Stage(s, 1),
            "<A0 F0 B0 >G0 W0 <A1 F1 B1 >G1 W1 <A2 F2 B2 >G2 W2 OPT");
}

TEST(ScheduleTest, GPipeShape) {
  Schedule s = MakeGPipeSchedule(2, 2);
  EXPECT_EQ(Stage(s, 0), "F0 >A0 F1 >A1 <G0 B0 W0 <G1 B1 W1 OPT");
  EXPECT_EQ(Stage(s, 1), "<A0 F0 <A1 F1 B0 >G0 W0 B1 >G1 W1 OPT");
}

TEST(ScheduleTest, GeneratedSchedulesAreValid) {
  for (int S : {1, 2, 3, 4, 8}) {
    for (int M : {1, 2, 3, 4, 8, 13}) {
      for (const char* name : {"gpipe", "1f1b", "zbh1"}) {
        auto sched = MakeTrainingSchedule(name, S, M);
        ASSERT_TRUE(sched.ok());
        EXPECT_TRUE(ValidateSchedule(*sched).ok())
            << name << " S=" << S << " M=" << M << ": "
            << ValidateSchedule(*sched);
      }
      EXPECT_TRUE(ValidateSchedule(MakeForwardOnlySchedule(S, M)).ok());
    }
  }
}

TEST(ScheduleTest, BackwardRunsInAscendingOrderUnderBothSchedules) {
  for (const char* name : {"gpipe", "1f1b", "zbh1"}) {
    Schedule s = *MakeTrainingSchedule(name, 4, 8);
    for (const auto& stage : s.stages) {
      int last = -1;
      for (const Action& a : stage) {
        if (a.kind != ActionKind::kBackwardWeight) continue;
        EXPECT_EQ(a.microbatch, last + 1) << name;
        last = a.microbatch;
      }
    }
  }
}

TEST(ScheduleTest, ZeroBubbleH1DefersWeightGradients) {
  // Weight passes wait while an input gradient or a forward can run, and
  // fill the cool-down instead.
  Schedule s = MakeZeroBubbleH1Schedule(2, 3);
  EXPECT_EQ(Stage(s, 0),
            "F0 >A0 F1 >A1 <G0 B0 F2 >A2 <G1 B1 W0 W1 <G2 B2 W2 OPT");
  EXPECT_EQ(Stage(s, 1),
            "<A0 F0 B0 >G0 <A1 F1 B1 >G1 W0 <A2 F2 B2 >G2 W1 W2 OPT");
  Schedule s3 = MakeZeroBubbleH1Schedule(3, 4);
  EXPECT_EQ(Stage(s3, 0),
            "F0 >A0 F1 >A1 F2 >A2 <G0 B0 F3 >A3 <G1 B1 W0 <G2 B2 W1 W2 <G3 B3 "
            "W3 OPT");
  EXPECT_EQ(Stage(s3, 2),
            "<A0 F0 B0 >G0 <A1 F1 B1 >G1 <A2 F2 B2 >G2 W0 <A3 F3 B3 >G3 W1 W2 "
            "W3 OPT");
  // Valid, and weight passes ascend, for every size tried.
  for (int S = 1; S <= 8; ++S) {
    for (int M = 1; M <= 16; ++M) {
      Schedule z = MakeZeroBubbleH1Schedule(S, M);
      ASSERT_TRUE(ValidateSchedule(z).ok())
          << "S=" << S << " M=" << M << ": " << ValidateSchedule(z);
      auto sim = SimulateSchedule(z, PassCosts{1, 1, 1});
      ASSERT_TRUE(sim.ok());
      for (int st = 0; st < S; ++st) {
        // Held from forward to weight pass: at most 2S - s - 1.
        EXPECT_LE(sim->peak_in_flight[st], std::min(M, 2 * S - st - 1))
            << "S=" << S << " M=" << M << " stage " << st;
      }
    }
  }
}

TEST(ScheduleTest, DetectsDeadlock) {
  // Stage 0 waits for a gradient before sending the activation stage 1
  // needs to produce it.
  Schedule s = MakeGPipeSchedule(2, 1);
  s.stages[0] = {
      {ActionKind::kForward, 0},        {ActionKind::kRecvGradient, 0},
      {ActionKind::kSendActivation, 0}, {ActionKind::kBackwardInput, 0},
      {ActionKind::kBackwardWeight, 0}, {ActionKind::kOptimizerStep, -1}};
  absl::Status st = ValidateSchedule(s);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("deadlock"));
  EXPECT_THAT(st.message(), HasSubstr("stage 0 at <G0"));
}

TEST(ScheduleTest, DetectsUnmatchedSend) {
  Schedule s = MakeGPipeSchedule(2, 2);
  // Stage 1 never receives microbatch 1's activation.
  auto& acts = s.stages[1];
  acts.erase(acts.begin() + 2);  // <A1
  absl::Status st = ValidateSchedule(s);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("stage 1"));
}

TEST(ScheduleTest, DetectsOutOfOrderReceive) {
  Schedule s = MakeGPipeSchedule(2, 2);
  // Stage 0 receives microbatch 1's gradient first; the channel delivers
  // 0's first.
  s.stages[0] = {
      {ActionKind::kForward, 0},        {ActionKind::kSendActivation, 0},
      {ActionKind::kForward, 1},        {ActionKind::kSendActivation, 1},
      {ActionKind::kRecvGradient, 1},   {ActionKind::kBackwardInput, 1},
      {ActionKind::kRecvGradient, 0},   {ActionKind::kBackwardInput, 0},
      {ActionKind::kBackwardWeight, 0}, {ActionKind::kBackwardWeight, 1},
      {ActionKind::kOptimizerStep, -1}};
  absl::Status st = ValidateSchedule(s);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(),
              HasSubstr("next message on its channel is for microbatch 0"));
}

TEST(ScheduleTest, LastStageRunsTheLossInMicrobatchOrder) {
  Schedule s = MakeGPipeSchedule(1, 2);
  std::swap(s.stages[0][0], s.stages[0][1]);  // F1 before F0
  absl::Status st = ValidateSchedule(s);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(),
              HasSubstr("F1: the last stage must run its forwards (the loss) "
                        "in ascending microbatch order, expected microbatch "
                        "0"));
}

TEST(ScheduleTest, DetectsWeightGradientBeforeInputGradient) {
  Schedule s = MakeGPipeSchedule(1, 1);
  s.stages[0] = {{ActionKind::kForward, 0},
                 {ActionKind::kBackwardWeight, 0},
                 {ActionKind::kBackwardInput, 0},
                 {ActionKind::kOptimizerStep, -1}};
  absl::Status st = ValidateSchedule(s);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("W0 before its backward-input"));
}

TEST(ScheduleTest, RejectsWeightGradientsOutOfOrder) {
  Schedule s = MakeGPipeSchedule(1, 2);
  s.stages[0] = {
      {ActionKind::kForward, 0},        {ActionKind::kForward, 1},
      {ActionKind::kBackwardInput, 0},  {ActionKind::kBackwardInput, 1},
      {ActionKind::kBackwardWeight, 1}, {ActionKind::kBackwardWeight, 0},
      {ActionKind::kOptimizerStep, -1}};
  absl::Status st = ValidateSchedule(s);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(),
              HasSubstr("ascending microbatch order, expected W0"));
}

TEST(ScheduleTest, UnknownName) {
  auto s = MakeTrainingSchedule("zb", 2, 2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("unknown schedule \"zb\""));
}

// --- Chunks: interleaved 1F1B and ZB-V -------------------------------------

TEST(ScheduleTest, ActionStringsShowTheChunkAfterADot) {
  EXPECT_EQ(ActionToString({ActionKind::kForward, 3, 1}), "F3.1");
  EXPECT_EQ(ActionToString({ActionKind::kSendGradient, 2, 2}), ">G2.2");
  EXPECT_EQ(ActionToString({ActionKind::kRecvActivation, 5, 0}), "<A5");
  EXPECT_EQ(ActionToString({ActionKind::kOptimizerStep, -1}), "OPT");
}

TEST(ScheduleTest, VirtualStagesOfEachLayout) {
  Schedule loop = *MakeInterleavedSchedule(4, 4, 2);
  EXPECT_EQ(loop.VirtualStage(3, 0), 3);
  EXPECT_EQ(loop.VirtualStage(0, 1), 4);  // fed by chunk 0 of stage 3
  EXPECT_EQ(loop.VirtualStage(3, 1), 7);
  EXPECT_EQ(loop.VirtualStage(0, 2), -1);
  Schedule v = *MakeZeroBubbleVSchedule(4, 4);
  EXPECT_EQ(v.num_chunks, 2);
  EXPECT_EQ(v.VirtualStage(3, 0), 3);
  EXPECT_EQ(v.VirtualStage(3, 1), 4);  // the tip of the V
  EXPECT_EQ(v.VirtualStage(0, 1), 7);  // the loss
  EXPECT_EQ(v.VirtualStage(4, 0), -1);
}

TEST(ScheduleTest, InterleavedShape) {
  Schedule s = *MakeInterleavedSchedule(2, 4, 2);
  // Stage 0 warms up with 2(S-s-1) + (v-1)S = 4 chunk forwards: group {0,1}
  // on chunk 0, then on chunk 1; backwards visit chunk 1 first.
  EXPECT_EQ(Stage(s, 0),
            "F0 >A0 F1 >A1 <A0.1 F0.1 >A0.1 <A1.1 F1.1 >A1.1 F2 >A2 <G0.1 "
            "B0.1 >G0.1 W0.1 F3 >A3 <G1.1 B1.1 >G1.1 W1.1 <A2.1 F2.1 >A2.1 "
            "<G0 B0 W0 <A3.1 F3.1 >A3.1 <G1 B1 W1 <G2.1 B2.1 >G2.1 W2.1 <G3.1 "
            "B3.1 >G3.1 W3.1 <G2 B2 W2 <G3 B3 W3 OPT");
  // Stage 1 chunk 1 is the last virtual stage: it computes the loss.
  EXPECT_EQ(Stage(s, 1),
            "<A0 F0 >A0 <A1 F1 >A1 <A0.1 F0.1 B0.1 >G0.1 W0.1 <A1.1 F1.1 B1.1 "
            ">G1.1 W1.1 <A2 F2 >A2 <G0 B0 >G0 W0 <A3 F3 >A3 <G1 B1 >G1 W1 "
            "<A2.1 F2.1 B2.1 >G2.1 W2.1 <A3.1 F3.1 B3.1 >G3.1 W3.1 <G2 B2 >G2 "
            "W2 <G3 B3 >G3 W3 OPT");
}

TEST(ScheduleTest, InterleavedNeedsMicrobatchesInGroupsOfStages) {
  auto s = MakeInterleavedSchedule(4, 6, 2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(),
              HasSubstr("microbatches (6) must be a multiple of stages (4)"));
  auto one = MakeInterleavedSchedule(4, 8, 1);
  EXPECT_THAT(one.status().message(), HasSubstr("needs >= 2 chunks"));
}

TEST(ScheduleTest, ZeroBubbleVShapeOnOneStage) {
  // With one stage the V is chunk 0 then chunk 1 on the same stage, handed
  // over by a local send and receive.
  Schedule s = *MakeZeroBubbleVSchedule(1, 2);
  EXPECT_EQ(Stage(s, 0),
            "F0 >A0 <A0.1 F0.1 B0.1 >G0.1 <G0 B0 W0.1 W0 F1 >A1 <A1.1 F1.1 "
            "B1.1 >G1.1 <G1 B1 W1.1 W1 OPT");
}

TEST(ScheduleTest, ChunkedSchedulesAreValid) {
  for (int S : {1, 2, 4}) {
    for (int M : {S, 2 * S, 4 * S, 8}) {
      for (int v : {2, 3}) {
        auto sched = MakeTrainingSchedule("interleaved", S, M, v);
        ASSERT_TRUE(sched.ok()) << sched.status();
        EXPECT_EQ(sched->num_chunks, v);
        EXPECT_TRUE(ValidateSchedule(*sched).ok())
            << "interleaved S=" << S << " M=" << M << " v=" << v << ": "
            << ValidateSchedule(*sched);
      }
      auto zbv = MakeTrainingSchedule("zbv", S, M, 2);
      ASSERT_TRUE(zbv.ok()) << zbv.status();
      EXPECT_TRUE(ValidateSchedule(*zbv).ok())
          << "zbv S=" << S << " M=" << M << ": " << ValidateSchedule(*zbv);
    }
  }
  // ZB-V takes any microbatch count.
  for (int S : {2, 3, 5}) {
    for (int M : {1, 3, 7, 13}) {
      auto zbv = MakeZeroBubbleVSchedule(S, M);
      ASSERT_TRUE(zbv.ok()) << zbv.status();
      EXPECT_TRUE(ValidateSchedule(*zbv).ok())
          << "zbv S=" << S << " M=" << M << ": " << ValidateSchedule(*zbv);
    }
  }
}

TEST(ScheduleTest, WeightGradientsAscendPerStageAndChunk) {
  for (const char* name : {"interleaved", "zbv"}) {
    Schedule s = *MakeTrainingSchedule(name, 4, 8, 2);
    for (const auto& stage : s.stages) {
      std::vector<int> last(s.num_chunks, -1);
      for (const Action& a : stage) {
        if (a.kind != ActionKind::kBackwardWeight) continue;
        EXPECT_EQ(a.microbatch, last[a.chunk] + 1) << name;
        last[a.chunk] = a.microbatch;
      }
      for (int c = 0; c < s.num_chunks; ++c) EXPECT_EQ(last[c], 7) << name;
    }
  }
}

TEST(ScheduleTest, RejectsWeightGradientsOutOfOrderOnAChunk) {
  Schedule s = *MakeZeroBubbleVSchedule(4, 8);
  // Stage 0 runs B0.1 ... B3.1 before W0.1: swap W0.1 and W1.1.
  for (Action& a : s.stages[0]) {
    if (a.kind == ActionKind::kBackwardWeight && a.chunk == 1 &&
        a.microbatch < 2) {
      a.microbatch = 1 - a.microbatch;
    }
  }
  absl::Status st = ValidateSchedule(s);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(),
              HasSubstr("W1.1: weight gradients must run in ascending "
                        "microbatch order, expected W0.1"));
}

TEST(ScheduleTest, RejectsAChunkTheStageDoesNotHold) {
  Schedule s = *MakeZeroBubbleVSchedule(2, 2);
  s.stages[1][0].chunk = 2;
  absl::Status st = ValidateSchedule(s);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("stage 1: <A0.2: chunk out of range"));
  // The first virtual stage receives from no one.
  Schedule t = *MakeZeroBubbleVSchedule(2, 1);
  t.stages[0].insert(t.stages[0].begin(), {ActionKind::kRecvActivation, 0});
  EXPECT_THAT(ValidateSchedule(t).message(),
              HasSubstr("<A0: first virtual stage has no sender"));
}

TEST(ScheduleTest, DetectsDeadlockAtTheTipOfTheV) {
  // Stage 1 (S=2) waits for chunk 1's activation before its chunk 0 has
  // sent it: a local hand-off deadlocks like any other.
  Schedule s = *MakeZeroBubbleVSchedule(2, 1);
  auto& acts = s.stages[1];
  auto recv = std::find(acts.begin(), acts.end(),
                        Action{ActionKind::kRecvActivation, 0, 1});
  ASSERT_NE(recv, acts.end());
  Action r = *recv;
  acts.erase(recv);
  acts.insert(acts.begin(), r);
  absl::Status st = ValidateSchedule(s);
  EXPECT_THAT(st.message(), HasSubstr("deadlock"));
  EXPECT_THAT(st.message(), HasSubstr("stage 1 at <A0.1"));
}

TEST(ScheduleTest, ChunkedSchedulesTakeTheirDefaultChunkCount) {
  for (const char* name : {"interleaved", "zbv"}) {
    absl::StatusOr<Schedule> s = MakeTrainingSchedule(name, 4, 8);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->num_chunks, 2);
    EXPECT_EQ(s->num_chunks, DefaultChunks(name));
    EXPECT_EQ(s->layout, ChunkLayoutOf(name));
  }
  EXPECT_EQ(MakeTrainingSchedule("1f1b", 4, 8)->num_chunks, 1);
  EXPECT_EQ(MakeTrainingSchedule("zbv", 4, 8, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ScheduleTest, ChunkCountsEachScheduleTakes) {
  EXPECT_EQ(MakeTrainingSchedule("interleaved", 4, 8, 0)->num_chunks, 2);
  EXPECT_EQ(MakeTrainingSchedule("interleaved", 4, 8, 3)->num_chunks, 3);
  EXPECT_EQ(MakeTrainingSchedule("zbv", 4, 8, 0)->num_chunks, 2);
  EXPECT_EQ(MakeTrainingSchedule("1f1b", 4, 8, 0)->num_chunks, 1);
  EXPECT_EQ(MakeTrainingSchedule("1f1b", 4, 8, 1)->ToString(),
            MakeOneFOneBSchedule(4, 8).ToString());
  EXPECT_THAT(MakeTrainingSchedule("zbv", 4, 8, 3).status().message(),
              HasSubstr("exactly 2 chunks per stage, got 3"));
  EXPECT_THAT(MakeTrainingSchedule("1f1b", 4, 8, 2).status().message(),
              HasSubstr("holds 1 chunk per stage, got 2"));
  EXPECT_THAT(MakeTrainingSchedule("zb", 4, 8, 2).status().message(),
              HasSubstr("unknown schedule \"zb\""));
}

// p = 4, m = 8: the numbers docs/SCHEDULES.md tabulates.
struct BubbleCase {
  const char* name;
  int chunks;
  PassCosts costs;
  double makespan;
  double bubble;
  double of_compute;
};

TEST(ScheduleTest, BubbleAtFourStagesEightMicrobatches) {
  const PassCosts unit{1, 1, 1}, unsplit{1, 2, 0};
  const BubbleCase cases[] = {
      // Unsplit backward: the textbook (p-1)/(m+p-1) = 3/11, and 1/v of
      // the bubble time for interleaved: 3/(vm+p-1).
      {"gpipe", 1, unsplit, 33, 3.0 / 11, 3.0 / 8},
      {"1f1b", 1, unsplit, 33, 3.0 / 11, 3.0 / 8},
      {"zbh1", 1, unsplit, 33, 3.0 / 11, 3.0 / 8},
      {"interleaved", 2, unsplit, 28.5, 3.0 / 19, 3.0 / 16},
      {"interleaved", 3, unsplit, 27, 3.0 / 27, 3.0 / 24},
      // F = B = W = 1: every schedule sends the input gradient before its
      // weight pass. ZB-V idles only (p-1)F/2 (the first activation's trip
      // to the last stage), which no order can avoid.
      {"gpipe", 1, unit, 30, 6.0 / 30, 6.0 / 24},
      {"1f1b", 1, unit, 30, 6.0 / 30, 6.0 / 24},
      {"zbh1", 1, unit, 27, 3.0 / 27, 3.0 / 24},
      {"interleaved", 2, unit, 27, 3.0 / 27, 3.0 / 24},
      {"interleaved", 3, unit, 26, 2.0 / 26, 2.0 / 24},
      {"zbv", 2, unit, 25.5, 1.5 / 25.5, 1.5 / 24},
  };
  for (const BubbleCase& c : cases) {
    Schedule s = *MakeTrainingSchedule(c.name, 4, 8, c.chunks);
    auto sim = SimulateSchedule(s, c.costs);
    ASSERT_TRUE(sim.ok()) << sim.status();
    const std::string what =
        absl::StrCat(c.name, " v=", c.chunks, " costs ", c.costs.forward, ",",
                     c.costs.backward_input, ",", c.costs.backward_weight);
    EXPECT_NEAR(sim->makespan, c.makespan, 1e-9) << what;
    EXPECT_NEAR(sim->bubble, c.bubble, 1e-9) << what;
    EXPECT_NEAR(sim->bubble_of_compute, c.of_compute, 1e-9) << what;
    for (int st = 0; st < 4; ++st) {
      // A chunk pass costs 1/v: every stage does one step's worth of work.
      EXPECT_NEAR(sim->busy[st], 24, 1e-9) << what;
      EXPECT_NEAR(sim->idle[st], c.makespan - 24, 1e-9) << what;
    }
    EXPECT_NEAR(*SimulatedBubble(s, c.costs.forward, c.costs.backward_input,
                                 c.costs.backward_weight),
                c.bubble, 1e-12);
  }
}

TEST(ScheduleTest, ZeroBubbleVReachesTheShortestStepWithEqualPasses) {
  // Every stage does 6M chunk passes; the last one cannot start before
  // (S-1) chunk forwards: the step is at least 6M + S - 1 chunk passes.
  for (int S : {1, 2, 3, 4, 8}) {
    for (int k : {1, 2, 4}) {
      const int M = k * S;
      auto sim = SimulateSchedule(*MakeZeroBubbleVSchedule(S, M),
                                  PassCosts{2, 2, 2});  // chunk pass = 1
      ASSERT_TRUE(sim.ok());
      EXPECT_NEAR(sim->makespan, 6 * M + S - 1, 1e-9) << S << " " << M;
    }
  }
}

TEST(ScheduleTest, PeakInFlightMicrobatches) {
  for (int S : {1, 2, 4}) {
    for (int M : {S, 2 * S, 8}) {
      auto gpipe = *SimulateSchedule(MakeGPipeSchedule(S, M));
      auto ofob = *SimulateSchedule(MakeOneFOneBSchedule(S, M));
      auto zbv = *SimulateSchedule(*MakeZeroBubbleVSchedule(S, M));
      for (int s = 0; s < S; ++s) {
        EXPECT_EQ(gpipe.peak_in_flight[s], M);
        EXPECT_EQ(ofob.peak_in_flight[s], std::min(M, S - s));
        // ZB-V: 1F1B's peak (S microbatches = 2S chunk activations) on
        // every stage, never more.
        EXPECT_EQ(zbv.peak_chunk_activations[s], 2 * std::min(M, S))
            << "S=" << S << " M=" << M << " s=" << s;
        EXPECT_LE(zbv.peak_in_flight[s], ofob.peak_in_flight[0]);
      }
      for (int v : {2, 3}) {
        auto il = *SimulateSchedule(*MakeInterleavedSchedule(S, M, v));
        for (int s = 0; s < S; ++s) {
          // Megatron's warm-up plus the forward before the first backward:
          // stage 0 holds S + (S-1)/v microbatches, 1 + (S-1)/(Sv) times
          // 1F1B's.
          const int chunks = std::min(2 * (S - s - 1) + (v - 1) * S + 1, M * v);
          EXPECT_EQ(il.peak_chunk_activations[s], chunks)
              << "S=" << S << " M=" << M << " v=" << v << " s=" << s;
          EXPECT_DOUBLE_EQ(il.peak_in_flight[s],
                           static_cast<double>(chunks) / v);
        }
      }
    }
  }
  // The paper's formula at p = 4, v = 2: 4 * (1 + 3/8) = 5.5.
  auto il = *SimulateSchedule(*MakeInterleavedSchedule(4, 8, 2));
  EXPECT_DOUBLE_EQ(il.peak_in_flight[0], 5.5);
}

TEST(ScheduleTest, TimelineHoldsEveryPassInOrder) {
  Schedule s = *MakeZeroBubbleVSchedule(2, 3);
  auto sim = SimulateSchedule(s);
  ASSERT_TRUE(sim.ok());
  for (int st = 0; st < 2; ++st) {
    ASSERT_EQ(sim->timeline[st].size(), 3u * 3 * 2);
    double t = 0;
    for (const TimedAction& p : sim->timeline[st]) {
      EXPECT_GE(p.start, t - 1e-12);
      EXPECT_NEAR(p.end - p.start, 0.5, 1e-12);  // 1/v of a unit cost
      t = p.end;
    }
  }
}

// ZB-V orders its passes for the costs it is given: with unequal costs that
// order idles no more than the equal-cost order under the same costs, and
// it stays valid with weight passes ascending.
TEST(ScheduleTest, ZeroBubbleVOrdersForTheGivenCosts) {
  for (const PassCosts& costs :
       {PassCosts{1, 1.2, 0.8}, PassCosts{1.082, 0.475, 1.237},
        PassCosts{1, 2, 0.5}}) {
    auto tuned = MakeZeroBubbleVSchedule(4, 8, costs);
    auto unit = MakeZeroBubbleVSchedule(4, 8);
    ASSERT_TRUE(tuned.ok() && unit.ok());
    ASSERT_TRUE(ValidateSchedule(*tuned).ok()) << ValidateSchedule(*tuned);
    auto a = SimulateSchedule(*tuned, costs);
    auto b = SimulateSchedule(*unit, costs);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_LE(a->makespan, b->makespan + 1e-9)
        << costs.forward << "," << costs.backward_input << ","
        << costs.backward_weight;
    std::cout << "zbv p=4 m=8 costs " << costs.forward << ","
              << costs.backward_input << "," << costs.backward_weight
              << ": ordered for them " << a->bubble_of_compute
              << " of compute, equal-cost order " << b->bubble_of_compute
              << "\n";
  }
}

TEST(ScheduleTest, PeakChunkActivationsBoundsEverySimulationAndIsReached) {
  const PassCosts uneven{0.86, 0.44, 1.05};  // a real stage's, roughly
  for (const char* name : {"gpipe", "1f1b", "zbh1", "interleaved", "zbv"}) {
    for (int S = 1; S <= 5; ++S) {
      for (int M = 1; M <= 12; ++M) {
        for (int v : {0, 3}) {
          if (v == 3 && std::string(name) != "interleaved") continue;
          absl::StatusOr<Schedule> sched = MakeTrainingSchedule(name, S, M, v);
          if (!sched.ok()) continue;  // interleaved needs M % S == 0
          SCOPED_TRACE(
              absl::StrCat(name, " S=", S, " M=", M, " v=", sched->num_chunks));
          ASSERT_TRUE(ValidateSchedule(*sched).ok());
          absl::StatusOr<ScheduleSimulation> unit = SimulateSchedule(*sched);
          ASSERT_TRUE(unit.ok()) << unit.status();
          absl::StatusOr<Schedule> costed =
              MakeTrainingSchedule(name, S, M, v, uneven);
          ASSERT_TRUE(costed.ok());
          absl::StatusOr<ScheduleSimulation> skewed =
              SimulateSchedule(*costed, uneven);
          ASSERT_TRUE(skewed.ok()) << skewed.status();
          for (int s = 0; s < S; ++s) {
            const int bound =
                PeakChunkActivations(name, S, M, sched->num_chunks, s);
            EXPECT_EQ(unit->peak_chunk_activations[s], bound) << "stage " << s;
            EXPECT_LE(skewed->peak_chunk_activations[s], bound)
                << "stage " << s;
          }
        }
      }
    }
  }
}

TEST(ScheduleTest, ForwardOnlyRunsEveryChunkOfEveryLayout) {
  for (int S = 1; S <= 4; ++S) {
    for (int M = 1; M <= 5; ++M) {
      for (const auto& [v, layout] :
           std::vector<std::pair<int, ChunkLayout>>{{1, ChunkLayout::kLoop},
                                                    {2, ChunkLayout::kLoop},
                                                    {3, ChunkLayout::kLoop},
                                                    {2, ChunkLayout::kV}}) {
        Schedule sched = MakeForwardOnlySchedule(S, M, v, layout);
        SCOPED_TRACE(sched.ToString());
        EXPECT_TRUE(ValidateSchedule(sched).ok()) << ValidateSchedule(sched);
        int forwards = 0;
        for (const auto& acts : sched.stages) {
          for (const Action& a : acts) {
            forwards += a.kind == ActionKind::kForward;
          }
        }
        EXPECT_EQ(forwards, S * v * M);
      }
    }
  }
}

TEST(ScheduleTest, StageChunkOfInvertsVirtualStageOf) {
  for (ChunkLayout layout : {ChunkLayout::kLoop, ChunkLayout::kV}) {
    for (int S = 1; S <= 4; ++S) {
      for (int v = 1; v <= (layout == ChunkLayout::kV ? 2 : 3); ++v) {
        for (int k = 0; k < S * v; ++k) {
          const StageChunk at = StageChunkOf(layout, S, v, k);
          EXPECT_EQ(VirtualStageOf(layout, S, v, at.stage, at.chunk), k);
        }
        EXPECT_EQ(StageChunkOf(layout, S, v, S * v).stage, -1);
      }
    }
  }
}

}  // namespace
}  // namespace trainyard
