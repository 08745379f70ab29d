// In-process tests of the controller over real gRPC on 127.0.0.1: JobService
// stubs as users, WorkerService streams as fake workers. Restarts of jobs
// and of the controller are in controller_recovery_test.cc.
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "controller/controller_test_fixture.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "gtest/gtest.h"
#include "security/tokens.h"

namespace trainyard {
namespace controller_test {
namespace {

using v1::ControllerMessage;
using v1::Job;
using v1::JobEvent;
using v1::WorkerMessage;

TEST_F(ControllerTest, SubmitWithSameRequestIdReturnsSameJob) {
  Job a = Submit("req-1", Spec(1));
  Job b = Submit("req-1", Spec(1));
  Job c = Submit("req-2", Spec(1));
  EXPECT_FALSE(a.job_id().empty());
  EXPECT_EQ(a.job_id(), b.job_id());
  EXPECT_NE(a.job_id(), c.job_id());
  EXPECT_EQ(a.state(), v1::QUEUED);
  v1::ListJobsRequest req;
  v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(jobs_->ListJobs(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.jobs_size(), 2);
}

TEST_F(ControllerTest, MissingRequestIdIsInvalidArgument) {
  Job job;
  grpc::Status st = TrySubmit("", Spec(1), &job);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("request_id"), std::string::npos);
}

TEST_F(ControllerTest, InvalidSpecListsEveryFieldPath) {
  v1::JobSpec spec = Spec(1);
  spec.set_steps(0);
  spec.mutable_model()->mutable_blocks(0)->set_ffn_hidden_size(-4);
  spec.mutable_parallelism()->set_schedule("zb");
  Job job;
  grpc::Status st = TrySubmit("bad", spec, &job);
  ASSERT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  for (const char* path :
       {"steps", "model.blocks[0].ffn_hidden_size", "parallelism.schedule"}) {
    EXPECT_NE(st.error_message().find(path), std::string::npos)
        << path << " missing from: " << st.error_message();
  }
  // Nothing was stored.
  v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(jobs_->ListJobs(&ctx, v1::ListJobsRequest(), &resp).ok());
  EXPECT_EQ(resp.jobs_size(), 0);
}

TEST_F(ControllerTest, ListJobsFiltersAndPagesNewestFirst) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(Submit(absl::StrCat("r", i), Spec(1)).job_id());
  }
  Job j;
  ASSERT_TRUE(Cancel(ids[1], &j).ok());
  ASSERT_TRUE(Cancel(ids[3], &j).ok());

  v1::ListJobsRequest req;
  req.add_states(v1::CANCELLED);
  v1::ListJobsResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(jobs_->ListJobs(&ctx, req, &resp).ok());
  }
  ASSERT_EQ(resp.jobs_size(), 2);
  EXPECT_EQ(resp.jobs(0).job_id(), ids[3]);
  EXPECT_EQ(resp.jobs(1).job_id(), ids[1]);
  EXPECT_TRUE(resp.next_page_token().empty());

  std::vector<std::string> seen;
  req.Clear();
  req.set_page_size(2);
  do {
    grpc::ClientContext ctx;
    ASSERT_TRUE(jobs_->ListJobs(&ctx, req, &resp).ok());
    EXPECT_LE(resp.jobs_size(), 2);
    for (const Job& job : resp.jobs()) seen.push_back(job.job_id());
    req.set_page_token(resp.next_page_token());
  } while (!resp.next_page_token().empty());
  EXPECT_EQ(seen,
            (std::vector<std::string>{ids[4], ids[3], ids[2], ids[1], ids[0]}));

  req.set_page_token("garbage");
  grpc::ClientContext ctx;
  grpc::Status st = jobs_->ListJobs(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("page_token"), std::string::npos);
}

TEST_F(ControllerTest, ListJobsPagesStayUnderTheMessageLimit) {
  // 40 jobs of ~61 KB each (a 60 KB task.config, within its limit): a
  // default page of 50 would be 2.4 MB.
  v1::JobSpec spec = Spec(1);
  (*spec.mutable_task()->mutable_config()->mutable_fields())["blob"]
      .set_string_value(std::string(60000, 'b'));
  for (int i = 0; i < 40; ++i) Submit(absl::StrCat("big-", i), spec);
  std::set<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    v1::ListJobsRequest req;
    req.set_page_token(token);
    v1::ListJobsResponse resp;
    grpc::ClientContext ctx;
    grpc::Status st = jobs_->ListJobs(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_LE(resp.ByteSizeLong(), size_t{2} << 20);
    for (const Job& j : resp.jobs()) {
      EXPECT_TRUE(seen.insert(j.job_id()).second) << j.job_id();
    }
    token = resp.next_page_token();
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(seen.size(), 40u);
  EXPECT_EQ(pages, 2);
}

TEST_F(ControllerTest, GangWaitsForAllStagesThenAssignsWithPeers) {
  Job job = Submit("gang", Spec(3));
  EXPECT_EQ(job.reason(), "needs 3 idle cpu workers; none registered");
  auto w1 = NewWorker("alpha");
  auto w2 = NewWorker("beta");
  WaitJob(job.job_id(), [](const Job& j) {
    return j.reason() == "needs 3 idle cpu workers; 2 registered";
  });
  EXPECT_FALSE(w1->Next(absl::Milliseconds(200)).has_value());
  auto w3 = NewWorker("gamma");
  std::vector<FakeWorker*> workers = {w1.get(), w2.get(), w3.get()};
  for (int k = 0; k < 3; ++k) {
    auto m = workers[k]->Next();
    ASSERT_TRUE(m && m->has_assign()) << workers[k]->name();
    EXPECT_EQ(m->assign().job_id(), job.job_id());
    EXPECT_EQ(m->assign().rank(), k);
    EXPECT_EQ(m->assign().spec().parallelism().stages(), 3);
    EXPECT_EQ(m->assign().spec().device(), "cpu");  // normalized
    ASSERT_EQ(m->assign().peer_addresses_size(), 3);
    for (int p = 0; p < 3; ++p) {
      EXPECT_EQ(m->assign().peer_addresses(p), workers[p]->peer());
    }
  }
  Job running = WaitState(job.job_id(), v1::RUNNING);
  EXPECT_EQ(running.workers_size(), 3);
  EXPECT_EQ(running.workers(2), w3->id());
  EXPECT_GT(running.start_time_ms(), 0);
}

TEST_F(ControllerTest, ListWorkersShowsWhoRunsWhat) {
  auto w1 = NewWorker("alpha");
  auto w2 = NewWorker("beta");
  Job job = Submit("one-stage", Spec(1));
  auto m = w1->Next();
  ASSERT_TRUE(m && m->has_assign());
  grpc::ClientContext ctx;
  v1::ListWorkersResponse resp;
  ASSERT_TRUE(jobs_->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp).ok());
  ASSERT_EQ(resp.workers_size(), 2);
  EXPECT_EQ(resp.workers(0).name(), "alpha");
  EXPECT_EQ(resp.workers(0).worker_id(), w1->id());
  EXPECT_EQ(resp.workers(0).capabilities().peer_address(), w1->peer());
  EXPECT_EQ(resp.workers(0).job_id(), job.job_id());
  EXPECT_EQ(resp.workers(0).stage(), 0);
  EXPECT_EQ(resp.workers(1).name(), "beta");
  EXPECT_EQ(resp.workers(1).job_id(), "");
  EXPECT_EQ(resp.workers(1).stage(), -1);
  EXPECT_GE(resp.workers(1).last_heartbeat_ms_ago(), 0);
}

TEST_F(ControllerTest, ImpossibleJobsSayWhy) {
  Job gpu = Submit("gpu", Spec(1, 5, "cuda"));
  EXPECT_EQ(gpu.state(), v1::QUEUED);
  EXPECT_EQ(gpu.reason(), "needs a cuda worker; none registered");
  auto w = NewWorker("cpu-only");
  Job big = Submit("big", Spec(4));
  EXPECT_EQ(big.reason(), "needs 4 idle cpu workers; 1 registered");
  EXPECT_EQ(Get(gpu.job_id()).reason(), "needs a cuda worker; none registered");
  EXPECT_FALSE(w->Next(absl::Milliseconds(100)).has_value());
}

TEST_F(ControllerTest, WatchersSeeEveryStepExactlyOnceInOrder) {
  auto w0 = NewWorker("s0");
  auto w1 = NewWorker("s1");
  Job job = Submit("watched", Spec(2));
  ASSERT_TRUE(w0->Next()->has_assign());
  ASSERT_TRUE(w1->Next()->has_assign());
  Watcher a(jobs_.get(), job.job_id());
  Watcher b(jobs_.get(), job.job_id());
  constexpr int kSteps = 40;
  std::unique_ptr<Watcher> late;
  for (int step = 1; step <= kSteps; ++step) {
    w0->Step(job.job_id(), 0, step, 1.0 / step);
    w1->Step(job.job_id(), 1, step, 1.0 / step, /*num_metrics=*/1);
    if (step == kSteps / 2) {
      ASSERT_TRUE(a.WaitForSteps(step, absl::Seconds(5)));
      late = std::make_unique<Watcher>(jobs_.get(), job.job_id(), 0);
    }
  }
  w0->Done(job.job_id(), 0);
  w1->Done(job.job_id(), 1);
  Job done = WaitState(job.job_id(), v1::SUCCEEDED);
  EXPECT_EQ(done.steps_completed(), kSteps);
  EXPECT_FALSE(done.reason().empty());
  for (Watcher* w : {&a, &b, late.get()}) {
    EXPECT_TRUE(w->Wait().ok());
    std::vector<JobEvent> events = w->events();
    ASSERT_GE(events.size(), 2u);
    EXPECT_TRUE(events.front().has_state());
    EXPECT_EQ(events.back().state().state(), v1::SUCCEEDED);
    EXPECT_EQ(w->steps(), Range(1, kSteps));
    for (const JobEvent& e : events) {
      if (!e.has_step()) continue;
      // Published when the last stage reports; stage 0's report of the
      // same step travels on another stream and may come later.
      ASSERT_GE(e.step().stages_size(), 1);
      ASSERT_LE(e.step().stages_size(), 2);
      EXPECT_EQ(e.step().stages(e.step().stages_size() - 1).stage(), 1);
      if (e.step().stages_size() == 2) {
        EXPECT_EQ(e.step().stages(0).stage(), 0);
        EXPECT_DOUBLE_EQ(e.step().stages(0).forward_s(), 0.001);
      }
      EXPECT_EQ(e.step().metrics().size(), 1u);
      EXPECT_DOUBLE_EQ(e.step().loss(), 1.0 / e.step().step());
    }
  }
  // The late watcher started while RUNNING; a and b saw QUEUED or RUNNING
  // first, then RUNNING, then SUCCEEDED.
  EXPECT_EQ(late->events().front().state().state(), v1::RUNNING);
}

// Two ranks exchange the NCCL id through the controller over their real
// Connect streams; a worker outside the job is refused; cancelling the job
// answers a Get still waiting at once.
TEST_F(ControllerTest, RendezvousOverTheWorkerStreams) {
  auto w0 = NewWorker("gpu0", "cuda:0");
  auto w1 = NewWorker("gpu1", "cuda:1");
  auto outsider = NewWorker("gpu2", "cuda:2");
  Job job = Submit("nccl", Spec(2, 20, "cuda"));
  const std::string id = job.job_id();
  for (FakeWorker* w : {w0.get(), w1.get()}) {
    auto m = w->Next();
    ASSERT_TRUE(m && m->has_assign()) << w->name();
    ASSERT_EQ(m->assign().placements_size(), 2);
    EXPECT_EQ(m->assign().placements(0).device(), "cuda:0");
    EXPECT_EQ(m->assign().placements(1).device(), "cuda:1");
    // FakeWorker registers no hostname: the peer address's host.
    EXPECT_EQ(m->assign().placements(1).host(), "gpu1.peer");
  }
  const std::string key = id + "/nccl_id";
  const std::string unique_ids(384, '\x5a');
  w1->RendezvousGet(id, 1, key, 30000);
  EXPECT_FALSE(w1->Next(absl::Milliseconds(100)).has_value());  // waits
  w0->RendezvousPut(id, 1, key, unique_ids);
  auto put = w0->Next();
  ASSERT_TRUE(put && put->has_rendezvous_reply());
  EXPECT_EQ(put->rendezvous_reply().request_id(), 1);
  EXPECT_EQ(put->rendezvous_reply().code(), 0)
      << put->rendezvous_reply().error();
  auto got = w1->Next();
  ASSERT_TRUE(got && got->has_rendezvous_reply());
  EXPECT_EQ(got->rendezvous_reply().request_id(), 1);
  EXPECT_EQ(got->rendezvous_reply().code(), 0);
  EXPECT_EQ(got->rendezvous_reply().value(), unique_ids);

  outsider->RendezvousGet(id, 9, key, 0);
  auto refused = outsider->Next();
  ASSERT_TRUE(refused && refused->has_rendezvous_reply());
  EXPECT_EQ(refused->rendezvous_reply().code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(refused->rendezvous_reply().error(),
            absl::StrCat("rendezvous of job ", id, ": worker ", outsider->id(),
                         " (gpu2) runs no stage of it"));

  w0->RendezvousGet(id, 2, id + "/never_put", 60000);
  EXPECT_FALSE(w0->Next(absl::Milliseconds(100)).has_value());
  const absl::Time start = absl::Now();
  Job cancelled;
  ASSERT_TRUE(Cancel(id, &cancelled, "operator").ok());
  std::optional<ControllerMessage> aborted;
  // The cancel and the reply travel on the same stream, in either order.
  for (int i = 0; i < 2; ++i) {
    auto m = w0->Next();
    ASSERT_TRUE(m.has_value());
    if (m->has_rendezvous_reply()) aborted = m;
  }
  ASSERT_TRUE(aborted.has_value());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(aborted->rendezvous_reply().request_id(), 2);
  EXPECT_EQ(aborted->rendezvous_reply().code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(aborted->rendezvous_reply().error(),
            absl::StrCat("rendezvous of job ", id,
                         ": closed, the job ended CANCELLED: cancelled by "
                         "request: operator"));
}

// The transport a job's stages chose is in its history: watchers see it
// (once) before the steps, and a watcher resuming from a later step does
// not see it again.
TEST_F(ControllerTest, TransportNoteIsPartOfTheHistory) {
  auto w0 = NewWorker("s0");
  auto w1 = NewWorker("s1");
  Job job = Submit("noted", Spec(2, 3));
  ASSERT_TRUE(w0->Next()->has_assign());
  ASSERT_TRUE(w1->Next()->has_assign());
  const std::string reason = "all 2 stages are on distinct GPUs: using NCCL";
  w0->ReportTransport(job.job_id(), 0, reason);
  w1->ReportTransport(job.job_id(), 1, reason);
  for (int step = 1; step <= 3; ++step) {
    w0->Step(job.job_id(), 0, step, 1);
    w1->Step(job.job_id(), 1, step, 1);
  }
  w0->Done(job.job_id(), 0);
  w1->Done(job.job_id(), 1);
  WaitState(job.job_id(), v1::SUCCEEDED);
  auto notes_of = [](Watcher& w) {
    std::vector<std::string> notes;
    for (const JobEvent& e : w.events()) {
      if (e.has_note()) notes.push_back(e.note().text());
    }
    return notes;
  };
  Watcher all(jobs_.get(), job.job_id());
  ASSERT_TRUE(all.Wait().ok());
  EXPECT_EQ(notes_of(all), std::vector<std::string>{"transport: " + reason});
  Watcher resumed(jobs_.get(), job.job_id(), /*from_step=*/2);
  ASSERT_TRUE(resumed.Wait().ok());
  EXPECT_TRUE(notes_of(resumed).empty());
  EXPECT_EQ(resumed.steps(), Range(2, 3));
}

TEST_F(ControllerTest, ReconnectFromStepMissesNothing) {
  auto w = NewWorker("solo");
  Job job = Submit("reconnect", Spec(1));
  ASSERT_TRUE(w->Next()->has_assign());
  for (int step = 1; step <= 10; ++step) w->Step(job.job_id(), 0, step, 1);
  int64_t last_seen = 0;
  {
    Watcher first(jobs_.get(), job.job_id());
    ASSERT_TRUE(first.WaitForSteps(7, absl::Seconds(5)));
    last_seen = first.steps().back();  // the client "disconnects" here
  }
  for (int step = 11; step <= 15; ++step) w->Step(job.job_id(), 0, step, 1);
  Watcher again(jobs_.get(), job.job_id(), last_seen + 1);
  ASSERT_TRUE(again.WaitForSteps(15, absl::Seconds(5)));
  w->Done(job.job_id(), 0);
  EXPECT_TRUE(again.Wait().ok());
  EXPECT_EQ(again.steps(), Range(last_seen + 1, 15));
  // A watch of a finished job replays and ends.
  Watcher replay(jobs_.get(), job.job_id(), 14);
  EXPECT_TRUE(replay.Wait().ok());
  EXPECT_EQ(replay.steps(), Range(14, 15));
  // For a finished job the terminal state comes last, after the replay.
  EXPECT_EQ(replay.events().back().state().state(), v1::SUCCEEDED);
}

TEST_F(ControllerTest, SlowWatcherDoesNotBlockOthers) {
  auto w = NewWorker("solo");
  Job job = Submit("slow", Spec(1, 400));
  ASSERT_TRUE(w->Next()->has_assign());
  Watcher slow(jobs_.get(), job.job_id(), 0, /*read=*/false);
  Watcher fast(jobs_.get(), job.job_id());
  // ~3 KB per step: 400 steps are far more than the HTTP/2 flow-control
  // window the never-reading watcher can absorb.
  constexpr int kSteps = 400;
  for (int step = 1; step <= kSteps; ++step) {
    w->Step(job.job_id(), 0, step, 1, /*num_metrics=*/60);
  }
  w->Done(job.job_id(), 0);
  EXPECT_TRUE(fast.Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(fast.steps(), Range(1, kSteps));
  EXPECT_EQ(Get(job.job_id()).state(), v1::SUCCEEDED);
  // The slow watcher lost nothing: once it reads, it gets every step.
  slow.Start();
  EXPECT_TRUE(slow.Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(slow.steps(), Range(1, kSteps));
}

TEST_F(ControllerTest, CancelQueuedJob) {
  Job job = Submit("q", Spec(2));
  Job cancelled;
  ASSERT_TRUE(Cancel(job.job_id(), &cancelled, "not needed").ok());
  EXPECT_EQ(cancelled.state(), v1::CANCELLED);
  EXPECT_NE(cancelled.reason().find("not needed"), std::string::npos);
  Job again;
  grpc::Status st = Cancel(job.job_id(), &again);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("CANCELLED"), std::string::npos);
  st = Cancel("job-404", &again);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ControllerTest, CancelRunningJobCancelsStagesAndFreesWorkers) {
  auto w0 = NewWorker("a");
  auto w1 = NewWorker("b");
  Job job = Submit("run", Spec(2));
  ASSERT_TRUE(w0->Next()->has_assign());
  ASSERT_TRUE(w1->Next()->has_assign());
  Watcher watch(jobs_.get(), job.job_id());
  Job cancelled;
  ASSERT_TRUE(Cancel(job.job_id(), &cancelled, "user asked").ok());
  EXPECT_EQ(cancelled.state(), v1::CANCELLED);
  for (FakeWorker* w : {w0.get(), w1.get()}) {
    auto m = w->Next();
    ASSERT_TRUE(m && m->has_cancel());
    EXPECT_EQ(m->cancel().job_id(), job.job_id());
  }
  EXPECT_TRUE(watch.Wait().ok());
  EXPECT_EQ(watch.events().back().state().state(), v1::CANCELLED);
  Job next = Submit("next", Spec(2));
  auto m = w0->Next();
  ASSERT_TRUE(m && m->has_assign());
  EXPECT_EQ(m->assign().job_id(), next.job_id());
}

TEST_F(ControllerTest, WorkerLostMidJobFailsJobAndFreesSurvivors) {
  auto w0 = NewWorker("pod-0");
  auto w1 = NewWorker("pod-1");
  auto w2 = NewWorker("pod-2");
  // Recovery off: today's fail-fast behaviour.
  Job job = Submit("doomed", Spec(3, 20, "", /*max_restarts=*/0));
  Job next = Submit("next", Spec(2));
  for (FakeWorker* w : {w0.get(), w1.get(), w2.get()}) {
    ASSERT_TRUE(w->Next()->has_assign());
  }
  w0->Step(job.job_id(), 0, 1, 1);
  w1->Crash();
  Job failed = WaitState(job.job_id(), v1::FAILED);
  EXPECT_NE(failed.reason().find(absl::StrCat("worker ", w1->id(),
                                              " (pod-1) running stage 1 "
                                              "was lost")),
            std::string::npos)
      << failed.reason();
  for (FakeWorker* w : {w0.get(), w2.get()}) {
    auto cancel = w->Next();
    ASSERT_TRUE(cancel && cancel->has_cancel());
    EXPECT_EQ(cancel->cancel().job_id(), job.job_id());
    auto assign = w->Next();
    ASSERT_TRUE(assign && assign->has_assign());
    EXPECT_EQ(assign->assign().job_id(), next.job_id());
  }
  EXPECT_EQ(WaitState(next.job_id(), v1::RUNNING).workers(0), w0->id());
}

TEST_F(ControllerTest, SilentWorkerIsLostAfterHeartbeatTimeout) {
  auto w = NewWorker("quiet");
  Job job = Submit("hb", Spec(1, 20, "", /*max_restarts=*/0));
  ASSERT_TRUE(w->Next()->has_assign());
  absl::Time t0 = absl::Now();
  w->StopHeartbeats();
  Job failed = WaitState(job.job_id(), v1::FAILED);
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(700));
  EXPECT_NE(failed.reason().find(absl::StrCat("worker ", w->id(),
                                              " (quiet) running stage 0 was "
                                              "lost: no heartbeat for")),
            std::string::npos)
      << failed.reason();
  EXPECT_TRUE(w->StreamEnded(absl::Seconds(5)));
}

// A controller that does not run for longer than the heartbeat timeout
// (its lock held, as by a disk write that stalls) blames no worker for its
// own deafness; a worker silent across the stall is still lost.
TEST_F(ControllerTest, StalledControllerBlamesNoWorkerForItsStall) {
  auto w0 = NewWorker("a");
  auto w1 = NewWorker("b");
  Job job = Submit("stall", Spec(2, 4, "", /*max_restarts=*/0));
  ASSERT_TRUE(w0->Next()->has_assign());
  ASSERT_TRUE(w1->Next()->has_assign());
  w0->Started(job.job_id(), 0, 0);
  w1->Started(job.job_id(), 1, 0);
  auto quiet = NewWorker("quiet");  // idle, and silent from now on
  quiet->StopHeartbeats();
  server_->manager()->StallForTesting(absl::Milliseconds(2400));  // 3x
  // Longer than the heartbeat timeout after the stall: the heartbeats sent
  // during it have been read, and nothing else was needed.
  absl::SleepFor(absl::Milliseconds(1200));
  std::vector<std::string> listed;
  for (const WorkerInfo& w : server_->manager()->ListWorkers()) {
    listed.push_back(w.name);
  }
  EXPECT_EQ(listed, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(quiet->StreamEnded(absl::Seconds(1)));
  Job running = Get(job.job_id());
  EXPECT_EQ(running.state(), v1::RUNNING) << running.reason();
  EXPECT_EQ(running.restarts(), 0);
  for (int step = 1; step <= 4; ++step) {
    w0->Step(job.job_id(), 0, step, step);
    w1->Step(job.job_id(), 1, step, step);
  }
  w0->Done(job.job_id(), 0);
  w1->Done(job.job_id(), 1);
  EXPECT_EQ(WaitState(job.job_id(), v1::SUCCEEDED).restarts(), 0);
}

// With 4 events in memory, a 30-step job's history is almost all in the
// store: watchers that start at the beginning, from a step, or after the
// end, and one that reads nothing until the job has ended, each see every
// step they asked for once, in order.
TEST_F(ControllerTest, WatchersReplayHistoryOlderThanMemoryFromTheStore) {
  server_.reset();
  events_in_memory_ = 4;
  StartServer();
  auto w = NewWorker("a");
  Job job = Submit("long", Spec(1, 30));
  const std::string& id = job.job_id();
  ASSERT_TRUE(w->Next()->has_assign());
  w->Started(id, 0, 0);
  Watcher live(jobs_.get(), id);
  Watcher stalled(jobs_.get(), id, 0, /*read=*/false);
  for (int step = 1; step <= 30; ++step) w->Step(id, 0, step, step);
  WaitJob(id, [](const Job& j) { return j.steps_completed() == 30; });
  Watcher from_12(jobs_.get(), id, 12);
  w->Done(id, 0);
  WaitState(id, v1::SUCCEEDED);
  Watcher after(jobs_.get(), id);
  stalled.Start();
  for (Watcher* watcher : {&live, &stalled, &after}) {
    EXPECT_TRUE(watcher->Wait().ok());
    EXPECT_EQ(watcher->steps(), Range(1, 30));
    EXPECT_EQ(watcher->events().back().state().state(), v1::SUCCEEDED);
  }
  EXPECT_TRUE(from_12.Wait().ok());
  EXPECT_EQ(from_12.steps(), Range(12, 30));
  auto log = server_->manager()->WatchJob(id);
  ASSERT_TRUE(log.ok());
  EXPECT_EQ((*log)->first_in_memory(), (*log)->size() - 4);
}

TEST_F(ControllerTest, StageFailureFailsJobWithItsError) {
  auto w0 = NewWorker("a");
  auto w1 = NewWorker("b");
  Job job = Submit("fails", Spec(2));
  ASSERT_TRUE(w0->Next()->has_assign());
  ASSERT_TRUE(w1->Next()->has_assign());
  // NOT_FOUND would fail again: no restart, although restarts are on.
  w1->Done(job.job_id(), 1, false, "plugin \"xent\" not found", false,
           absl::StatusCode::kNotFound);
  Job failed = WaitState(job.job_id(), v1::FAILED);
  EXPECT_NE(failed.reason().find("plugin \"xent\" not found"),
            std::string::npos);
  EXPECT_NE(failed.reason().find("stage 1"), std::string::npos);
  EXPECT_NE(failed.reason().find("not restarted"), std::string::npos)
      << failed.reason();
  EXPECT_EQ(failed.restarts(), 0);
  auto m = w0->Next();
  ASSERT_TRUE(m && m->has_cancel());
}

TEST_F(ControllerTest, FirstMessageMustBeRegister) {
  auto stub = v1::WorkerService::NewStub(channel_);
  grpc::ClientContext ctx;
  auto stream = stub->Connect(&ctx);
  WorkerMessage hb;
  hb.mutable_heartbeat()->set_time_ms(1);
  stream->Write(hb);
  ControllerMessage m;
  EXPECT_FALSE(stream->Read(&m));
  grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("RegisterWorker"), std::string::npos);
}

TEST_F(ControllerTest, HealthServiceReportsServing) {
  // grpc.health.v1.Health/Check with an empty HealthCheckRequest; the
  // response HealthCheckResponse{status: SERVING (1)} encodes as 08 01.
  grpc::Slice empty(std::string{});
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  grpc::Status st =
      grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
          channel_.get(),
          grpc::internal::RpcMethod("/grpc.health.v1.Health/Check",
                                    grpc::internal::RpcMethod::NORMAL_RPC),
          &ctx, request, &response);
  ASSERT_TRUE(st.ok()) << st.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

// Reads a whole WatchLogs stream.
struct LogsRead {
  grpc::Status status;
  std::vector<v1::LogLine> lines;
};
LogsRead ReadLogs(v1::JobService::Stub* stub, const std::string& job_id,
                  bool follow, const std::string& token = "") {
  v1::WatchLogsRequest req;
  req.set_job_id(job_id);
  req.set_follow(follow);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  auto reader = stub->WatchLogs(&ctx, req);
  LogsRead out;
  v1::LogLine line;
  while (reader->Read(&line)) out.lines.push_back(line);
  out.status = reader->Finish();
  return out;
}

TEST_F(ControllerTest, WatchLogsReplaysThenFollowsUntilTheJobEnds) {
  auto w0 = NewWorker("s0");
  auto w1 = NewWorker("s1");
  Job job = Submit("logged", Spec(2));
  ASSERT_TRUE(w0->Next()->has_assign());
  ASSERT_TRUE(w1->Next()->has_assign());
  w0->Log(job.job_id(), 0, "stage 0 started");
  // The line travels on the worker's stream; wait until it is held.
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  LogsRead held;
  do {
    held = ReadLogs(jobs_.get(), job.job_id(), /*follow=*/false);
    ASSERT_TRUE(held.status.ok()) << held.status.error_message();
  } while (held.lines.empty() && absl::Now() < deadline);
  ASSERT_EQ(held.lines.size(), 1u);
  EXPECT_EQ(held.lines[0].worker_id(), w0->id());
  EXPECT_EQ(held.lines[0].worker_name(), "s0");

  LogsRead followed;
  std::thread follower(
      [&] { followed = ReadLogs(jobs_.get(), job.job_id(), /*follow=*/true); });
  w1->Log(job.job_id(), 1, "stage 1 started");
  w0->Log(job.job_id(), 0, "stage 0 done");
  w0->Done(job.job_id(), 0);
  w1->Log(job.job_id(), 1, "stage 1 done");
  w1->Done(job.job_id(), 1);
  WaitState(job.job_id(), v1::SUCCEEDED);
  follower.join();  // the stream ends with the job
  ASSERT_TRUE(followed.status.ok()) << followed.status.error_message();
  std::vector<std::string> texts;
  for (const v1::LogLine& l : followed.lines) texts.push_back(l.text());
  EXPECT_THAT(texts, ::testing::UnorderedElementsAre(
                         "stage 0 started", "stage 1 started", "stage 0 done",
                         "stage 1 done"));
  for (size_t i = 0; i < followed.lines.size(); ++i) {
    EXPECT_EQ(followed.lines[i].seq(), static_cast<int64_t>(i));
  }
  // After the end, a follower gets the lines and the end at once.
  LogsRead after = ReadLogs(jobs_.get(), job.job_id(), /*follow=*/true);
  EXPECT_TRUE(after.status.ok());
  EXPECT_EQ(after.lines.size(), 4u);
}

TEST_F(ControllerTest, GetTraceReturnsTheStagesSpans) {
  auto w0 = NewWorker("s0");
  auto w1 = NewWorker("s1");
  Job job = Submit("traced", Spec(2));
  ASSERT_TRUE(w0->Next()->has_assign());
  ASSERT_TRUE(w1->Next()->has_assign());
  w0->TracedStep(job.job_id(), 0, 1, 4);
  w1->TracedStep(job.job_id(), 1, 1, 4);
  v1::GetTraceRequest req;
  req.set_job_id(job.job_id());
  req.set_step(1);
  v1::GetTraceResponse trace;
  grpc::Status st;
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  do {
    grpc::ClientContext ctx;
    st = jobs_->GetTrace(&ctx, req, &trace);
  } while ((!st.ok() || trace.stages_size() < 2) && absl::Now() < deadline);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(trace.stages_size(), 2);
  EXPECT_EQ(trace.stages(1).worker_id(), w1->id());
  EXPECT_EQ(trace.stages(1).spans_size(), 4);

  req.set_step(7);
  grpc::ClientContext ctx;
  st = jobs_->GetTrace(&ctx, req, &trace);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(st.error_message(),
              ::testing::HasSubstr("step 7 is not held; steps 1..1 are"));
}

TEST_F(ControllerTest, TracesAndLogsAreAuthenticatedAndOwned) {
  const std::string tokens = dir_ + "/tokens";
  const std::string alice = NewToken();
  const std::string bob = NewToken();
  ASSERT_TRUE(AppendToken(tokens, "alice", Role::kUser, alice).ok());
  ASSERT_TRUE(AppendToken(tokens, "bob", Role::kUser, bob).ok());
  server_.reset();
  StartServer(absl::Seconds(10), tokens);
  v1::SubmitJobRequest submit;
  submit.set_request_id("alices");
  *submit.mutable_spec() = Spec(1);
  Job job;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + alice);
    ASSERT_TRUE(jobs_->SubmitJob(&ctx, submit, &job).ok());
  }
  auto get_trace = [&](const std::string& token) {
    v1::GetTraceRequest req;
    req.set_job_id(job.job_id());
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::GetTraceResponse resp;
    return jobs_->GetTrace(&ctx, req, &resp);
  };
  EXPECT_EQ(get_trace("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(get_trace(bob).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  grpc::Status mine = get_trace(alice);
  EXPECT_EQ(mine.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(mine.error_message(), ::testing::HasSubstr("has not run yet"));

  EXPECT_EQ(ReadLogs(jobs_.get(), job.job_id(), false).status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ReadLogs(jobs_.get(), job.job_id(), false, bob).status.error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  LogsRead own = ReadLogs(jobs_.get(), job.job_id(), false, alice);
  EXPECT_TRUE(own.status.ok()) << own.status.error_message();
  EXPECT_TRUE(own.lines.empty());
}

}  // namespace
}  // namespace controller_test
}  // namespace trainyard
