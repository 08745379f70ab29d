// Two worker daemons, one stage each, over the real TCP transport against
// a fake controller: their losses equal `trainyard train`'s bitwise, a
// restart from the in-memory snapshots they hold for each other continues
// as the first run did, and cancelling one stage stops the other.
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/trainyard.pb.h"
#include "worker/fake_controller.h"
#include "worker/worker_daemon.h"
#include "worker/worker_test_util.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using ::trainyard::testing::Assign;
using ::trainyard::testing::Cancel;
using ::trainyard::testing::Heard;
using ::trainyard::testing::LocalLosses;
using ::trainyard::testing::SmallSpec;
using ::trainyard::testing::TestOptions;
using ::trainyard::testing::WorkerDaemonTest;
using ::trainyard::v1::ControllerMessage;
using ::trainyard::v1::JobSpec;

// Two worker daemons with the real TCP transport, one stage each.
class TwoStageTest : public WorkerDaemonTest {
 protected:
  void StartWorkers() {
    for (const char* name : {"stage-a", "stage-b"}) {
      WorkerOptions options = TestOptions(controller_->address());
      options.name = name;
      options.connect_transport = nullptr;  // TCP over a PeerListener
      options.peer_address = "";
      options.listen = "127.0.0.1:0";
      options.peer_connect_timeout = absl::Seconds(10);
      workers_.push_back(StartWorker(options));
      ASSERT_NE(workers_.back(), nullptr);
      ASSERT_THAT(workers_.back()->peer_address(),
                  ::testing::StartsWith("127.0.0.1:"));
    }
    ASSERT_FALSE(controller_->WaitForRegistration(2).empty());
    // Stage s runs on the s-th registered worker.
    for (const auto& reg : controller_->registered()) {
      peers_.push_back(reg.capabilities().peer_address());
    }
    ids_ = controller_->worker_ids();
  }

  void AssignBoth(const std::string& job_id, const JobSpec& spec) {
    for (int s = 0; s < 2; ++s) {
      ASSERT_TRUE(controller_->Send(ids_[s], Assign(job_id, spec, s, peers_)));
    }
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::string> ids_;
  std::vector<std::string> peers_;
};

TEST_F(TwoStageTest, LossesEqualTheLocalRunnerBitwise) {
  StartWorkers();
  JobSpec spec = SmallSpec(6);
  spec.mutable_parallelism()->set_stages(2);
  spec.mutable_parallelism()->set_microbatches(4);
  AssignBoth("pipe", spec);
  ASSERT_TRUE(controller_->WaitForDone("pipe").has_value());
  int done = 0;
  for (int i = 0; i < 500 && done < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    done = 0;
    for (const Heard& h : controller_->heard()) done += h.message.has_done();
  }
  ASSERT_EQ(done, 2);
  std::map<int, std::vector<double>> losses;  // by stage
  std::vector<int64_t> eval_steps;
  std::map<std::string, std::vector<std::string>> log_lines;  // by worker
  std::set<std::string> done_workers;
  for (const Heard& h : controller_->heard()) {
    if (h.message.has_step()) {
      const auto& r = h.message.step();
      ASSERT_EQ(r.step().stages_size(), 1);
      EXPECT_EQ(r.step().stages(0).stage(), r.stage());
      // Plugin metrics come from the last stage only.
      EXPECT_EQ(r.step().metrics().count("accuracy"), r.stage() == 1 ? 1u : 0u);
      EXPECT_EQ(r.step().step(),
                static_cast<int64_t>(losses[r.stage()].size()) + 1);
      losses[r.stage()].push_back(r.step().loss());
      // The step's spans ride along (worker/stage_runner_test checks them).
      EXPECT_EQ(r.trace().stage(), r.stage());
      EXPECT_GT(r.trace().spans_size(), 0);
      EXPECT_GT(r.trace().step_us(), 0);
    } else if (h.message.has_eval()) {
      // Every stage reports its eval passes, as a span; the metrics are
      // the last stage's.
      const auto& e = h.message.eval();
      ASSERT_EQ(e.trace().spans_size(), 1);
      EXPECT_EQ(e.trace().spans(0).kind(), trainyard::v1::SPAN_EVAL);
      if (e.stage() == 1) {
        eval_steps.push_back(e.eval().step());
      } else {
        EXPECT_TRUE(e.eval().metrics().empty());
      }
    } else if (h.message.has_log()) {
      EXPECT_EQ(h.message.log().job_id(), "pipe");
      // Sent before the stage's end.
      EXPECT_EQ(done_workers.count(h.worker_id), 0u) << h.message.log().text();
      log_lines[h.worker_id].push_back(h.message.log().text());
    } else if (h.message.has_done()) {
      EXPECT_TRUE(h.message.done().ok()) << h.message.done().error();
      done_workers.insert(h.worker_id);
    }
  }
  EXPECT_THAT(eval_steps, ::testing::ElementsAre(3, 6));
  // The stage's own lines, without the worker's name in front.
  ASSERT_EQ(log_lines.size(), 2u);
  for (const auto& [worker, lines] : log_lines) {
    EXPECT_THAT(lines, ::testing::Contains(::testing::MatchesRegex(
                           "starting job pipe stage [01] \\(attempt 0\\)")))
        << worker;
    EXPECT_THAT(lines, ::testing::Contains(
                           ::testing::MatchesRegex("job pipe stage [01] done")))
        << worker;
  }
  const std::vector<double> local = LocalLosses(spec);
  ASSERT_EQ(local.size(), 6u);
  EXPECT_EQ(losses[0], local);
  EXPECT_EQ(losses[1], local);
}

// In-memory snapshots: each stage keeps its own and its neighbour's, tells
// the controller (StateHeld), and a restart from them, with each stage's
// state sent by the other worker, continues bitwise as the first run did;
// under 1F1B and under ZB-V (two chunks per worker: the snapshots travel
// among messages for both chunks).
class SnapshotRestartTest : public TwoStageTest,
                            public ::testing::WithParamInterface<const char*> {
};

TEST_P(SnapshotRestartTest, RestartFromSnapshotsHeldByTheOtherWorker) {
  StartWorkers();
  JobSpec spec = SmallSpec(10);
  spec.mutable_parallelism()->set_stages(2);
  spec.mutable_parallelism()->set_schedule(GetParam());
  if (std::string(GetParam()) == "zbv") {
    // 4 blocks for 2 stages x 2 chunks: two more 16 -> 16 before the head.
    auto* blocks = spec.mutable_model()->mutable_blocks();
    const v1::BlockSpec head = blocks->Get(1);
    *blocks->Mutable(1) = blocks->Get(0);
    *blocks->Add() = blocks->Get(0);
    *blocks->Add() = head;
  }
  spec.mutable_parallelism()->set_microbatches(2);
  spec.mutable_recovery()->set_snapshot_every(2);
  AssignBoth("snap", spec);
  auto wait_done = [&](int want) {
    int done = 0;
    for (int i = 0; i < 500 && done < want; ++i) {
      done = 0;
      for (const Heard& h : controller_->heard()) done += h.message.has_done();
      if (done < want) absl::SleepFor(absl::Milliseconds(20));
    }
    return done;
  };
  ASSERT_EQ(wait_done(2), 2);
  // worker -> (stage, step) of the snapshots it reported holding.
  std::map<std::string, std::set<std::pair<int, int64_t>>> held;
  std::vector<double> first;  // stage 1's losses
  for (const Heard& h : controller_->heard()) {
    if (h.message.has_held()) {
      held[h.worker_id].insert(
          {h.message.held().stage(), h.message.held().step()});
    } else if (h.message.has_step() && h.message.step().stage() == 1) {
      first.push_back(h.message.step().step().loss());
    }
  }
  ASSERT_EQ(first.size(), 10u);
  // Snapshots after steps 2, 4, 6 and 8 (none after the last), each stage's
  // on both workers.
  std::set<std::pair<int, int64_t>> both;
  for (int stage : {0, 1}) {
    for (int64_t step : {2, 4, 6, 8}) both.insert({stage, step});
  }
  EXPECT_EQ(held[ids_[0]], both);
  EXPECT_EQ(held[ids_[1]], both);
  // The restart: each stage's snapshot after step 6 comes from the other
  // worker.
  for (int s = 0; s < 2; ++s) {
    ControllerMessage m = Assign("snap", spec, s, peers_);
    m.mutable_assign()->set_attempt(1);
    m.mutable_assign()->mutable_snapshot()->set_step(6);
    m.mutable_assign()->mutable_snapshot()->add_source_ranks(1);
    m.mutable_assign()->mutable_snapshot()->add_source_ranks(0);
    ASSERT_TRUE(controller_->Send(ids_[s], m));
  }
  ASSERT_EQ(wait_done(4), 4);
  std::vector<double> second;
  int done_seen = 0;
  std::vector<int64_t> resumed;
  for (const Heard& h : controller_->heard()) {
    if (h.message.has_done() && ++done_seen <= 2) continue;
    if (done_seen < 2) continue;  // the first run's reports
    if (h.message.has_done()) {
      EXPECT_TRUE(h.message.done().ok()) << h.message.done().error();
    } else if (h.message.has_started()) {
      resumed.push_back(h.message.started().resume_step());
    } else if (h.message.has_step() && h.message.step().stage() == 1) {
      second.push_back(h.message.step().step().loss());
    }
  }
  EXPECT_EQ(resumed, (std::vector<int64_t>{6, 6}));
  ASSERT_EQ(second.size(), 4u);
  EXPECT_EQ(second, std::vector<double>(first.begin() + 6, first.end()));
}

INSTANTIATE_TEST_SUITE_P(Schedules, SnapshotRestartTest,
                         ::testing::Values("1f1b", "zbv"));

TEST_F(TwoStageTest, CancellingOneStageStopsTheOther) {
  StartWorkers();
  JobSpec spec = SmallSpec(1000000);
  spec.mutable_parallelism()->set_stages(2);
  AssignBoth("pipe", spec);
  ASSERT_TRUE(controller_->WaitForSteps("pipe", 4));
  const absl::Time start = absl::Now();
  ASSERT_TRUE(controller_->Send(ids_[0], Cancel("pipe", "stop stage 0")));
  std::map<std::string, trainyard::v1::StageDone> done;  // by worker id
  for (int i = 0; i < 250 && done.size() < 2; ++i) {
    for (const Heard& h : controller_->heard()) {
      if (h.message.has_done()) done[h.worker_id] = h.message.done();
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(done.size(), 2u);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_TRUE(done[ids_[0]].cancelled());
  EXPECT_EQ(done[ids_[0]].error(), "stop stage 0");
  EXPECT_FALSE(done[ids_[1]].ok());
  EXPECT_FALSE(done[ids_[1]].cancelled());
  // The neighbour's error names rank 0. It normally carries the abort
  // reason ("rank 0 (...) aborted: stop stage 0"), but when stage 1 was
  // writing to rank 0 at that moment the reset can win the race (see
  // docs/TRANSPORT_FRAME.md, "Abort").
  EXPECT_THAT(done[ids_[1]].error(), HasSubstr("rank 0"));
  EXPECT_FALSE(workers_[0]->busy());
  EXPECT_FALSE(workers_[1]->busy());
}

}  // namespace
}  // namespace trainyard
