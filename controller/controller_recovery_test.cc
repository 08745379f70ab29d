// In-process tests of restarts over real gRPC on 127.0.0.1: jobs whose
// gang breaks (recovery), and a controller restarted with jobs queued,
// running or recovering (adoption).
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "controller/controller_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace controller_test {
namespace {

using v1::ControllerMessage;
using v1::Job;
using v1::JobEvent;
using v1::WorkerMessage;

TEST_F(ControllerTest, RestartKeepsJobsAndHistories) {
  std::string finished, queued, running;
  {
    auto w0 = NewWorker("a");
    finished = Submit("finished", Spec(1)).job_id();
    ASSERT_TRUE(w0->Next()->has_assign());
    for (int step = 1; step <= 5; ++step) w0->Step(finished, 0, step, step);
    w0->Done(finished, 0);
    WaitState(finished, v1::SUCCEEDED);
    queued = Submit("queued", Spec(3)).job_id();
    running = Submit("running", Spec(1)).job_id();
    ASSERT_TRUE(w0->Next()->has_assign());
    WaitState(running, v1::RUNNING);
    server_.reset();  // workers still connected: the streams are cut
  }
  StartServer(/*adopt_timeout=*/absl::Milliseconds(300));
  Job f = Get(finished);
  EXPECT_EQ(f.state(), v1::SUCCEEDED);
  EXPECT_EQ(f.steps_completed(), 5);
  EXPECT_EQ(Get(queued).state(), v1::QUEUED);
  // The running job waits for its worker to reclaim its stage; none does
  // (the worker is gone), so it is restarted.
  Job r = WaitState(running, v1::RECOVERING);
  EXPECT_NE(r.reason().find("stage(s) 0 were not reclaimed"), std::string::npos)
      << r.reason();
  Watcher replay(jobs_.get(), finished);
  EXPECT_TRUE(replay.Wait().ok());
  EXPECT_EQ(replay.steps(), Range(1, 5));
  EXPECT_EQ(Submit("finished", Spec(1)).job_id(), finished);
  EXPECT_EQ(Submit("queued", Spec(3)).job_id(), queued);
  // The queued job still runs once its gang is there; the restarted
  // one-stage job backfills the first worker.
  auto a = NewWorker("x");
  WaitState(running, v1::RUNNING);
  auto b = NewWorker("y");
  auto c = NewWorker("z");
  auto d = NewWorker("zz");
  ASSERT_TRUE(d->Next()->has_assign());
  WaitState(queued, v1::RUNNING);
}

TEST_F(ControllerTest, LostWorkerRestartsTheJobOnASpare) {
  auto w0 = NewWorker("pod-0");
  auto w1 = NewWorker("pod-1");
  v1::JobSpec spec = Spec(2, 20, "", /*max_restarts=*/3);
  spec.mutable_checkpoint()->set_dir("/nonexistent/ckpt");  // not read here
  Job job = Submit("phoenix", spec);
  const std::string& id = job.job_id();
  for (FakeWorker* w : {w0.get(), w1.get()}) {
    auto m = w->Next();
    ASSERT_TRUE(m && m->has_assign());
    EXPECT_EQ(m->assign().attempt(), 0);
  }
  auto spare = NewWorker("spare");
  Watcher watch(jobs_.get(), id);
  w0->Started(id, 0, 0);
  w1->Started(id, 1, 0);
  for (int step = 1; step <= 5; ++step) {
    w0->Step(id, 0, step, step);
    w1->Step(id, 1, step, step);
  }
  WaitJob(id, [](const Job& j) { return j.steps_completed() == 5; });
  w1->Crash();
  Job recovering = WaitState(id, v1::RECOVERING);
  EXPECT_EQ(recovering.restarts(), 1);
  EXPECT_NE(recovering.reason().find(
                absl::StrCat("restart 1 of 3 after: worker ", w1->id(),
                             " (pod-1) running stage 1 was lost")),
            std::string::npos)
      << recovering.reason();
  // The survivor is stopped, and the job waits for it to stop.
  auto cancel = w0->Next();
  ASSERT_TRUE(cancel && cancel->has_cancel());
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(Get(id).state(), v1::RECOVERING);
  w0->Done(id, 0, false, "cancelled", /*cancelled=*/true);
  // The new gang: the survivor and the spare, attempt 1.
  auto b0 = w0->Next();
  auto b1 = spare->Next();
  ASSERT_TRUE(b0 && b0->has_assign() && b1 && b1->has_assign());
  EXPECT_EQ(b0->assign().rank(), 0);
  EXPECT_EQ(b1->assign().rank(), 1);
  EXPECT_EQ(b0->assign().attempt(), 1);
  EXPECT_EQ(b1->assign().peer_addresses(1), spare->peer());
  // From the newest checkpoint that verifies, but none after step 5: the
  // steps after the last published one must be recomputed and published.
  EXPECT_EQ(b0->assign().spec().checkpoint().resume(), "latest");
  ASSERT_TRUE(b0->assign().has_max_resume_step());
  EXPECT_EQ(b0->assign().max_resume_step(), 5);
  WaitState(id, v1::RUNNING);
  w0->Started(id, 0, 3);
  spare->Started(id, 1, 3);
  // Steps 4 and 5 are recomputed (bitwise the same) and not published
  // again; 6 to 8 are new.
  for (int step = 4; step <= 8; ++step) {
    w0->Step(id, 0, step, step);
    spare->Step(id, 1, step, step);
  }
  WaitJob(id, [](const Job& j) { return j.steps_completed() == 8; });
  w0->Done(id, 0);
  spare->Done(id, 1);
  Job done = WaitState(id, v1::SUCCEEDED);
  EXPECT_EQ(done.restarts(), 1);
  ASSERT_EQ(done.restart_reasons_size(), 1);
  EXPECT_TRUE(watch.Wait().ok());
  EXPECT_EQ(watch.steps(), Range(1, 8));
  std::vector<v1::JobRecovery> recoveries;
  std::vector<v1::JobState> states;
  for (const JobEvent& e : watch.events()) {
    if (e.has_recovery()) recoveries.push_back(e.recovery());
    if (e.has_state()) states.push_back(e.state().state());
  }
  ASSERT_EQ(recoveries.size(), 1u);
  EXPECT_EQ(recoveries[0].attempt(), 1);
  EXPECT_EQ(recoveries[0].resume_step(), 3);
  EXPECT_EQ(recoveries[0].detected_step(), 5);
  EXPECT_NE(recoveries[0].cause().find("pod-1"), std::string::npos);
  EXPECT_GE(recoveries[0].reschedule_s(), 0.2);
  ASSERT_EQ(recoveries[0].workers_size(), 2);
  EXPECT_EQ(recoveries[0].workers(1), spare->id());
  EXPECT_EQ(states, (std::vector<v1::JobState>{v1::RUNNING, v1::RECOVERING,
                                               v1::RUNNING, v1::SUCCEEDED}));
}

TEST_F(ControllerTest, RestartResumesFromTheNewestSnapshotsTheGangHolds) {
  auto w0 = NewWorker("pod-0");
  auto w1 = NewWorker("pod-1");
  auto w2 = NewWorker("pod-2");
  Job job = Submit("snap", Spec(3, 20, "", /*max_restarts=*/3));
  const std::string& id = job.job_id();
  for (FakeWorker* w : {w0.get(), w1.get(), w2.get()}) {
    ASSERT_TRUE(w->Next()->has_assign());
  }
  auto spare = NewWorker("spare");
  // Stage k's snapshot is kept by its worker and by stage k + 1's (the
  // last stage's by the one before it); a checkpoint after step 4.
  for (int64_t step : {4, 8, 12, 16}) {
    w0->Held(id, 0, step);
    w1->Held(id, 1, step);
    w1->Held(id, 0, step);
    w2->Held(id, 2, step);
    w1->Held(id, 2, step);
    // Stage 1's copy after step 12 never reached pod-2.
    if (step != 12) w2->Held(id, 1, step);
  }
  w0->Held(id, -1, 4);
  // Steps up to 14 are published: 16 is held in full but would skip 15.
  for (int64_t step = 1; step <= 14; ++step) w2->Step(id, 2, step, step);
  WaitJob(id, [](const Job& j) { return j.steps_completed() == 14; });
  w1->Crash();
  auto c0 = w0->Next();
  auto c2 = w2->Next();
  ASSERT_TRUE(c0 && c0->has_cancel() && c2 && c2->has_cancel());
  w0->Done(id, 0, false, "cancelled", true);
  w2->Done(id, 2, false, "cancelled", true);
  // pod-0 and pod-2 keep their stages; the spare takes stage 1, whose
  // snapshot after step 8 pod-2 sends (after step 12 only pod-1 had it;
  // 16 is past the published steps).
  auto a0 = w0->Next();
  auto a1 = spare->Next();
  auto a2 = w2->Next();
  ASSERT_TRUE(a0 && a0->has_assign() && a1 && a1->has_assign() && a2 &&
              a2->has_assign());
  EXPECT_EQ(a0->assign().rank(), 0);
  EXPECT_EQ(a1->assign().rank(), 1);
  EXPECT_EQ(a2->assign().rank(), 2);
  const v1::SnapshotResume& snap = a1->assign().snapshot();
  EXPECT_EQ(snap.step(), 8);
  EXPECT_EQ(
      std::vector<int>(snap.source_ranks().begin(), snap.source_ranks().end()),
      (std::vector<int>{0, 2, 2}));
  EXPECT_EQ(Get(id).reason(),
            "restart 1 of 3: resuming from in-memory snapshots after step 8");
  Watcher watch(jobs_.get(), id);
  for (FakeWorker* w : {w0.get(), spare.get(), w2.get()}) {
    w->Started(id, w == w0.get() ? 0 : w == spare.get() ? 1 : 2, 8);
  }
  w2->Step(id, 2, 9, 9);  // the first step after the resume
  auto recorded = [&] {
    for (const JobEvent& e : watch.events()) {
      if (e.has_recovery()) return true;
    }
    return false;
  };
  for (int i = 0; i < 500 && !recorded(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(recorded());
  Job cancelled;
  ASSERT_TRUE(Cancel(id, &cancelled).ok());
  EXPECT_TRUE(watch.Wait().ok());
  bool from_snapshot = false;
  for (const JobEvent& e : watch.events()) {
    if (e.has_recovery()) from_snapshot = e.recovery().from_snapshot();
  }
  EXPECT_TRUE(from_snapshot);
}

TEST_F(ControllerTest, AStageThatIgnoresItsCancelDoesNotHoldTheRestartUp) {
  auto w0 = NewWorker("stuck");
  auto w1 = NewWorker("pod-1");
  Job job = Submit("stuck-job", Spec(2, 20, "", /*max_restarts=*/3));
  const std::string& id = job.job_id();
  ASSERT_TRUE(w0->Next()->has_assign());
  ASSERT_TRUE(w1->Next()->has_assign());
  auto spare1 = NewWorker("spare-1");
  auto spare2 = NewWorker("spare-2");
  w1->Crash();
  auto cancel = w0->Next();
  ASSERT_TRUE(cancel && cancel->has_cancel());
  // pod-0 never reports its stage's end: after drain_timeout (1 s) its
  // worker is dropped and the job restarts on the spares.
  EXPECT_TRUE(w0->StreamEnded(absl::Seconds(5)));
  Job running = WaitJob(id, [](const Job& j) {
    return j.state() == v1::RUNNING && j.restarts() == 1;
  });
  EXPECT_EQ(std::vector<std::string>(running.workers().begin(),
                                     running.workers().end()),
            (std::vector<std::string>{spare1->id(), spare2->id()}));
  // The stuck worker reconnects and claims its old stage: refused, and it
  // gets no new stage until it reports that one's end.
  v1::StageClaim claim;
  claim.set_job_id(id);
  claim.set_stage(0);
  auto back =
      std::make_unique<FakeWorker>(channel_, "stuck", "cpu", w0->id(), claim);
  auto refused = back->Next();
  ASSERT_TRUE(refused && refused->has_cancel());
  Job other = Submit("other", Spec(1));
  EXPECT_FALSE(back->Next(absl::Milliseconds(300)).has_value());
  EXPECT_EQ(Get(other.job_id()).state(), v1::QUEUED);
  back->Done(id, 0, false, "cancelled", /*cancelled=*/true);
  auto assign = back->Next();
  ASSERT_TRUE(assign && assign->has_assign());
  EXPECT_EQ(assign->assign().job_id(), other.job_id());
}

TEST_F(ControllerTest, ControllerRestartedMidRecoveryWaitsForTheOldGang) {
  std::string id, id0;
  {
    auto w0 = NewWorker("pod-0");
    auto w1 = NewWorker("pod-1");
    id = Submit("mid", Spec(2, 20, "", /*max_restarts=*/3)).job_id();
    ASSERT_TRUE(w0->Next()->has_assign());
    ASSERT_TRUE(w1->Next()->has_assign());
    w1->Crash();
    WaitState(id, v1::RECOVERING);
    id0 = w0->id();
    // pod-0's stage never reports its end to this controller.
    server_.reset();
  }
  StartServer(/*adopt_timeout=*/absl::Seconds(3));
  EXPECT_EQ(Get(id).state(), v1::RECOVERING);
  auto a = NewWorker("spare-a");
  auto b = NewWorker("spare-b");
  // Two idle workers, but the old gang's pod-0 may still be training.
  EXPECT_FALSE(a->Next(absl::Milliseconds(500)).has_value());
  // It reconnects and claims its old stage: refused, and waited for.
  v1::StageClaim claim;
  claim.set_job_id(id);
  claim.set_stage(0);
  auto back =
      std::make_unique<FakeWorker>(channel_, "pod-0", "cpu", id0, claim);
  auto cancel = back->Next();
  ASSERT_TRUE(cancel && cancel->has_cancel());
  EXPECT_FALSE(a->Next(absl::Milliseconds(300)).has_value());
  back->Done(id, 0, false, "cancelled", /*cancelled=*/true);
  // pod-1 never comes back; it is not waited for past adopt_timeout.
  Job running = WaitJob(
      id, [](const Job& j) { return j.state() == v1::RUNNING; },
      absl::Seconds(10));
  EXPECT_EQ(running.restarts(), 1);
}

TEST_F(ControllerTest, MaxRestartsExhaustedFailsWithEveryReason) {
  Job job = Submit("fragile", Spec(1, 20, "", /*max_restarts=*/2));
  std::vector<std::unique_ptr<FakeWorker>> workers;
  for (int attempt = 0; attempt <= 2; ++attempt) {
    workers.push_back(NewWorker(absl::StrCat("try-", attempt)));
    auto m = workers.back()->Next();
    ASSERT_TRUE(m && m->has_assign());
    EXPECT_EQ(m->assign().attempt(), attempt);
    workers.back()->Crash();
    if (attempt < 2) {
      WaitJob(job.job_id(), [&](const Job& j) {
        return j.state() == v1::RECOVERING && j.restarts() == attempt + 1;
      });
    }
  }
  Job failed = WaitState(job.job_id(), v1::FAILED);
  EXPECT_EQ(failed.restarts(), 2);
  ASSERT_EQ(failed.restart_reasons_size(), 2);
  for (const char* part :
       {"gave up after 2 restart(s) (recovery.max_restarts = 2)",
        "restart 1 after: worker", "(try-0)", "restart 2 after: worker",
        "(try-1)", "then: worker", "(try-2)"}) {
    EXPECT_NE(failed.reason().find(part), std::string::npos)
        << part << " in: " << failed.reason();
  }
}

TEST_F(ControllerTest, RestartedControllerReadoptsARunningJob) {
  std::string job_id, id0, id1;
  {
    auto w0 = NewWorker("a");
    auto w1 = NewWorker("b");
    job_id = Submit("survivor", Spec(2)).job_id();
    ASSERT_TRUE(w0->Next()->has_assign());
    ASSERT_TRUE(w1->Next()->has_assign());
    for (int step = 1; step <= 3; ++step) {
      w0->Step(job_id, 0, step, step);
      w1->Step(job_id, 1, step, step);
    }
    WaitJob(job_id, [](const Job& j) { return j.steps_completed() == 3; });
    id0 = w0->id();
    id1 = w1->id();
    server_.reset();
  }
  StartServer();
  EXPECT_EQ(Get(job_id).state(), v1::RUNNING);
  Watcher watch(jobs_.get(), job_id);
  v1::StageClaim c0;
  c0.set_job_id(job_id);
  c0.set_stage(0);
  v1::StageClaim c1 = c0;
  c1.set_stage(1);
  // The workers reconnect under their ids, claim their stages and resend
  // what they reported meanwhile; steps already published are dropped.
  auto w0 = std::make_unique<FakeWorker>(channel_, "a", "cpu", id0, c0);
  EXPECT_EQ(w0->id(), id0);
  auto w1 = std::make_unique<FakeWorker>(channel_, "b", "cpu", id1, c1);
  EXPECT_EQ(w1->id(), id1);
  for (int step = 3; step <= 5; ++step) {
    w0->Step(job_id, 0, step, step);
    w1->Step(job_id, 1, step, step);
  }
  WaitJob(job_id, [](const Job& j) { return j.steps_completed() == 5; });
  EXPECT_EQ(Get(job_id).state(), v1::RUNNING);
  w0->Done(job_id, 0);
  w1->Done(job_id, 1);
  Job done = WaitState(job_id, v1::SUCCEEDED);
  EXPECT_EQ(done.restarts(), 0);
  EXPECT_TRUE(watch.Wait().ok());
  EXPECT_EQ(watch.steps(), Range(1, 5));
  bool noted = false;
  for (const JobEvent& e : watch.events()) {
    noted |=
        e.has_note() && e.note().text().find("reclaimed") != std::string::npos;
  }
  EXPECT_TRUE(noted);
  // A new worker never gets an id a job's history already names.
  auto fresh = NewWorker("c");
  EXPECT_NE(fresh->id(), id0);
  EXPECT_NE(fresh->id(), id1);
  // A claim on a job that no longer runs it is answered with a cancel.
  auto late = std::make_unique<FakeWorker>(channel_, "late", "cpu", "", c0);
  auto m = late->Next();
  ASSERT_TRUE(m && m->has_cancel());
  EXPECT_EQ(m->cancel().job_id(), job_id);
  EXPECT_NE(m->cancel().reason().find("SUCCEEDED"), std::string::npos);
}

}  // namespace
}  // namespace controller_test
}  // namespace trainyard
