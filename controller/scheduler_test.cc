#include "controller/scheduler.h"

#include "gtest/gtest.h"

namespace trainyard {
namespace {

SchedJob Job(const std::string& id, int stages, int priority = 0,
             int64_t order = 0, const std::string& device = "") {
  SchedJob j;
  j.id = id;
  j.stages = stages;
  j.priority = priority;
  j.order = order;
  j.device = device;
  return j;
}

std::vector<SchedWorker> Cpus(int n, int busy = 0) {
  std::vector<SchedWorker> w;
  for (int i = 0; i < n; ++i) {
    w.push_back({"w-" + std::to_string(i + 1), "cpu", i >= busy});
  }
  return w;
}

TEST(SchedulerTest, GangStartsOnlyWithEnoughIdleWorkers) {
  auto d = Schedule({Job("j1", 3)}, Cpus(2));
  EXPECT_TRUE(d.starts.empty());
  EXPECT_EQ(d.waiting["j1"], "needs 3 idle cpu workers; 2 registered");

  d = Schedule({Job("j1", 3)}, Cpus(4));
  ASSERT_EQ(d.starts.size(), 1u);
  EXPECT_EQ(d.starts[0].worker_ids,
            (std::vector<std::string>{"w-1", "w-2", "w-3"}));
}

TEST(SchedulerTest, SkipsBusyWorkersInRegistrationOrder) {
  auto workers = Cpus(4);
  workers[1].idle = false;
  auto d = Schedule({Job("j1", 2)}, workers);
  ASSERT_EQ(d.starts.size(), 1u);
  EXPECT_EQ(d.starts[0].worker_ids, (std::vector<std::string>{"w-1", "w-3"}));
}

TEST(SchedulerTest, WaitsForIdleWorkersWithPreciseReason) {
  auto d = Schedule({Job("j1", 2)}, Cpus(3, /*busy=*/2));
  EXPECT_TRUE(d.starts.empty());
  EXPECT_EQ(d.waiting["j1"], "waiting for 2 idle cpu workers; 1 of 3 idle");
}

TEST(SchedulerTest, HigherPriorityFirstThenFifo) {
  auto d = Schedule({Job("old-low", 1, 0, 1), Job("new-high", 1, 5, 3),
                     Job("mid-high", 1, 5, 2)},
                    Cpus(2));
  ASSERT_EQ(d.starts.size(), 2u);
  EXPECT_EQ(d.starts[0].job_id, "mid-high");
  EXPECT_EQ(d.starts[1].job_id, "new-high");
  EXPECT_EQ(d.waiting["old-low"], "waiting for 1 idle cpu worker; 0 of 2 idle");
}

TEST(SchedulerTest, NoBackfillBehindAWaitingGang) {
  // j1 (older) needs 3; 2 are idle. j2 needs 1 but must not overtake j1.
  auto d = Schedule({Job("j1", 3, 0, 1), Job("j2", 1, 0, 2)}, Cpus(3, 1));
  EXPECT_TRUE(d.starts.empty());
  EXPECT_EQ(d.waiting["j2"], "waiting behind j1 (priority 0) for cpu workers");
}

TEST(SchedulerTest, ImpossibleJobDoesNotBlockOthers) {
  auto d = Schedule(
      {Job("big", 4, 9, 1), Job("gpu", 1, 9, 2, "cuda"), Job("small", 1, 0, 3)},
      Cpus(2));
  ASSERT_EQ(d.starts.size(), 1u);
  EXPECT_EQ(d.starts[0].job_id, "small");
  EXPECT_EQ(d.waiting["big"], "needs 4 idle cpu workers; 2 registered");
  EXPECT_EQ(d.waiting["gpu"], "needs a cuda worker; none registered");
}

TEST(SchedulerTest, ReplicasNeedStagesTimesReplicasWorkers) {
  SchedJob job = Job("rep", 4, 0, 1);
  job.replicas = 2;
  auto d = Schedule({job}, Cpus(5));
  EXPECT_TRUE(d.starts.empty());
  EXPECT_EQ(d.waiting["rep"],
            "needs 8 idle cpu workers (4 stages x 2 replicas); 5 registered");
  d = Schedule({job}, Cpus(8));
  ASSERT_EQ(d.starts.size(), 1u);
  EXPECT_EQ(d.starts[0].worker_ids.size(), 8u);
}

TEST(SchedulerTest, DeviceKindsMatch) {
  std::vector<SchedWorker> workers = {
      {"w-1", "cpu", true}, {"w-2", "cuda:0", true}, {"w-3", "cuda:1", true}};
  auto d =
      Schedule({Job("g", 2, 0, 1, "cuda"), Job("c", 1, 0, 2, "cpu")}, workers);
  ASSERT_EQ(d.starts.size(), 2u);
  EXPECT_EQ(d.starts[0].worker_ids, (std::vector<std::string>{"w-2", "w-3"}));
  EXPECT_EQ(d.starts[1].worker_ids, (std::vector<std::string>{"w-1"}));
  EXPECT_EQ(WorkerDeviceKind(""), "cpu");
  EXPECT_EQ(JobDeviceKind(""), "cpu");
  d = Schedule({Job("c", 2)}, {{"w-2", "cuda:0", true}});
  EXPECT_EQ(d.waiting["c"], "needs 2 idle cpu workers; none registered");
}

}  // namespace
}  // namespace trainyard
