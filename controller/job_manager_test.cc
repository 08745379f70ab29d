// JobManager without gRPC: workers are fake WorkerLinks, so message order is
// exactly the order of the calls.
#include "controller/job_manager.h"

#include <stdlib.h>

#include <map>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/job_plan.h"

namespace trainyard {
namespace {

class FakeLink : public WorkerLink {
 public:
  void Send(const v1::ControllerMessage& msg) override {
    std::lock_guard<std::mutex> l(mu_);
    sent_.push_back(msg);
  }
  void Close(const absl::Status& status) override {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = status;
    is_closed_ = true;
  }
  std::vector<v1::ControllerMessage> sent() {
    std::lock_guard<std::mutex> l(mu_);
    return sent_;
  }
  bool is_closed() {
    std::lock_guard<std::mutex> l(mu_);
    return is_closed_;
  }

 private:
  std::mutex mu_;
  std::vector<v1::ControllerMessage> sent_;
  absl::Status closed_;
  bool is_closed_ = false;
};

v1::JobSpec Spec(int stages) {
  std::string blocks;
  for (int i = 0; i < stages; ++i) {
    blocks += std::string(i ? "," : R"({"inFeatures": 8, )") +
              std::string(i ? "{" : "") +
              R"("outFeatures": 8, "ffnHiddenSize": 16})";
  }
  auto spec = ParseJobSpecJson(absl::StrFormat(
                                   R"({"steps": 10, "model": {"blocks": [%s]},
              "parallelism": {"stages": %d}, "optimizer": {"lr": 0.1},
              "task": {"plugin": "mse"},
              "data": {"train": {"npy": {"features": "x.npy",
                                         "targets": "y.npy"}},
                       "batchSize": 4}})",
                                   blocks, stages),
                               "spec");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(JobManagerOptions()); }
  // Replaces the manager by one with `opts` in a fresh folder.
  void Make(JobManagerOptions opts) {
    std::string tmpl = std::string(getenv("TEST_TMPDIR")) + "/jm_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    opts.data_dir = tmpl;
    manager_.reset();
    auto m = JobManager::Create(opts);
    ASSERT_TRUE(m.ok()) << m.status();
    manager_ = *std::move(m);
  }
  std::string Register(const std::string& name, std::shared_ptr<FakeLink> link,
                       const std::string& device = "cpu",
                       const std::string& hostname = "") {
    v1::RegisterWorker reg;
    reg.set_name(name);
    reg.mutable_capabilities()->set_device(device);
    reg.mutable_capabilities()->set_peer_address(name + ":1");
    reg.mutable_capabilities()->set_hostname(hostname);
    auto id = manager_->RegisterWorker(reg, link);
    EXPECT_TRUE(id.ok());
    return *id;
  }
  void Step(const std::string& worker, const std::string& job, int stage,
            int64_t step) {
    v1::WorkerMessage m;
    m.mutable_step()->set_job_id(job);
    m.mutable_step()->set_stage(stage);
    m.mutable_step()->mutable_step()->set_step(step);
    m.mutable_step()->mutable_step()->add_stages()->set_comm_s(stage + 0.5);
    manager_->OnWorkerMessage(worker, m);
  }
  // A step report of `stage` carrying a trace of `spans` forward spans.
  void TracedStep(const std::string& worker, const std::string& job, int stage,
                  int64_t step, int spans) {
    v1::WorkerMessage m;
    m.mutable_step()->set_job_id(job);
    m.mutable_step()->set_stage(stage);
    m.mutable_step()->mutable_step()->set_step(step);
    v1::StageTrace* t = m.mutable_step()->mutable_trace();
    t->set_step_us(100 * spans);
    for (int i = 0; i < spans; ++i) {
      v1::StageSpan* s = t->add_spans();
      s->set_kind(v1::SPAN_FORWARD);
      s->set_microbatch(i);
      s->set_start_us(100 * i);
      s->set_end_us(100 * i + 50);
    }
    manager_->OnWorkerMessage(worker, m);
  }
  void LogLine(const std::string& worker, const std::string& job, int stage,
               const std::string& text) {
    v1::WorkerMessage m;
    m.mutable_log()->set_job_id(job);
    m.mutable_log()->set_stage(stage);
    m.mutable_log()->set_time_ms(1700000000123);
    m.mutable_log()->set_text(text);
    manager_->OnWorkerMessage(worker, m);
  }
  // Every line held in the job's log ring.
  std::vector<v1::LogLine> Lines(const std::string& job) {
    std::vector<v1::LogLine> out;
    auto ring = manager_->WatchLogs(job);
    EXPECT_TRUE(ring.ok()) << ring.status();
    if (!ring.ok()) return out;
    v1::LogLine line;
    for (int64_t seq = 0; (*ring)->Read(&seq, &line); ++seq) {
      out.push_back(line);
    }
    return out;
  }
  // Submits a `stages`-stage job on `device` and returns its id.
  std::string SubmitRunning(int stages, const std::string& device = "cpu",
                            const Caller& caller = Caller{"", true}) {
    v1::SubmitJobRequest req;
    req.set_request_id(absl::StrCat("r", ++submitted_));
    *req.mutable_spec() = Spec(stages);
    req.mutable_spec()->set_device(device);
    auto job = manager_->SubmitJob(req, caller);
    EXPECT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->state(), v1::RUNNING);
    return job->job_id();
  }
  void RendezvousPut(const std::string& worker, const std::string& job,
                     int64_t request_id, const std::string& key,
                     const std::string& value) {
    v1::WorkerMessage m;
    m.mutable_rendezvous_put()->set_request_id(request_id);
    m.mutable_rendezvous_put()->set_job_id(job);
    m.mutable_rendezvous_put()->set_key(key);
    m.mutable_rendezvous_put()->set_value(value);
    manager_->OnWorkerMessage(worker, m);
  }
  void RendezvousGet(const std::string& worker, const std::string& job,
                     int64_t request_id, const std::string& key,
                     int64_t timeout_ms) {
    v1::WorkerMessage m;
    m.mutable_rendezvous_get()->set_request_id(request_id);
    m.mutable_rendezvous_get()->set_job_id(job);
    m.mutable_rendezvous_get()->set_key(key);
    m.mutable_rendezvous_get()->set_timeout_ms(timeout_ms);
    manager_->OnWorkerMessage(worker, m);
  }
  std::unique_ptr<JobManager> manager_;
  int submitted_ = 0;
};

// The rendezvous replies `link` received, by request id.
std::map<int64_t, v1::RendezvousReply> Replies(FakeLink& link) {
  std::map<int64_t, v1::RendezvousReply> out;
  for (const v1::ControllerMessage& m : link.sent()) {
    if (m.has_rendezvous_reply()) {
      out[m.rendezvous_reply().request_id()] = m.rendezvous_reply();
    }
  }
  return out;
}

// Waits (the liveness thread answers timeouts) for reply `id` on `link`.
std::optional<v1::RendezvousReply> WaitReply(
    FakeLink& link, int64_t id, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    auto replies = Replies(link);
    if (replies.count(id)) return replies.at(id);
    if (absl::Now() > deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

TEST_F(JobManagerTest, StepEventCarriesTimingsOfAllStagesThatReported) {
  auto l0 = std::make_shared<FakeLink>();
  auto l1 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  std::string w1 = Register("b", l1);
  v1::SubmitJobRequest req;
  req.set_request_id("r");
  *req.mutable_spec() = Spec(2);
  auto job = manager_->SubmitJob(req);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::RUNNING);
  ASSERT_EQ(l0->sent().size(), 2u);  // registered, assign
  // Relative paths reach the worker as written.
  EXPECT_EQ(l0->sent()[1].assign().spec().data().train().npy().features(),
            "x.npy");

  Step(w0, job->job_id(), 0, 1);
  Step(w1, job->job_id(), 1, 1);  // published: both stages
  Step(w1, job->job_id(), 1, 2);  // published: only the last stage so far
  Step(w0, job->job_id(), 0, 2);  // late: dropped
  Step(w0, job->job_id(), 1, 3);  // wrong stage for w0: ignored

  auto log = manager_->WatchJob(job->job_id());
  ASSERT_TRUE(log.ok());
  std::vector<v1::StepMetrics> steps;
  std::vector<v1::JobEvent> events;
  ASSERT_TRUE((*log)->Read(0, (*log)->size(), &events).ok());
  for (const v1::JobEvent& ev : events) {
    if (ev.has_step()) steps.push_back(ev.step());
  }
  ASSERT_EQ(steps.size(), 2u);
  ASSERT_EQ(steps[0].stages_size(), 2);
  EXPECT_EQ(steps[0].stages(0).stage(), 0);
  EXPECT_DOUBLE_EQ(steps[0].stages(0).comm_s(), 0.5);
  EXPECT_EQ(steps[0].stages(1).stage(), 1);
  ASSERT_EQ(steps[1].stages_size(), 1);
  EXPECT_EQ(steps[1].stages(0).stage(), 1);
  EXPECT_EQ(manager_->GetJob(job->job_id())->steps_completed(), 2);
}

TEST_F(JobManagerTest, CancelledStageErrorIsUsedOnlyWithoutARealError) {
  auto l0 = std::make_shared<FakeLink>();
  auto l1 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  std::string w1 = Register("b", l1);
  v1::SubmitJobRequest req;
  req.set_request_id("r");
  *req.mutable_spec() = Spec(2);
  auto job = manager_->SubmitJob(req);
  ASSERT_TRUE(job.ok());
  v1::WorkerMessage m;
  m.mutable_done()->set_job_id(job->job_id());
  m.mutable_done()->set_stage(0);
  m.mutable_done()->set_error("peer closed");
  m.mutable_done()->set_cancelled(true);
  manager_->OnWorkerMessage(w0, m);
  EXPECT_EQ(manager_->GetJob(job->job_id())->state(), v1::RUNNING);
  m.mutable_done()->set_stage(1);
  m.mutable_done()->set_error("out of memory");
  m.mutable_done()->set_cancelled(false);
  manager_->OnWorkerMessage(w1, m);
  // The job restarts (both workers are idle, so at once) for the real
  // error, not the neighbour's symptom.
  auto restarted = manager_->GetJob(job->job_id());
  EXPECT_EQ(restarted->state(), v1::RUNNING);
  ASSERT_EQ(restarted->restart_reasons_size(), 1);
  EXPECT_NE(restarted->restart_reasons(0).find("out of memory"),
            std::string::npos);
  EXPECT_EQ(restarted->restart_reasons(0).find("peer closed"),
            std::string::npos);
}

TEST_F(JobManagerTest, StreamEndLosesWorkerAndUpdatesQueuedReason) {
  auto l0 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  v1::SubmitJobRequest req;
  req.set_request_id("r");
  *req.mutable_spec() = Spec(2);
  auto job = manager_->SubmitJob(req);
  EXPECT_EQ(job->reason(), "needs 2 idle cpu workers; 1 registered");
  manager_->OnWorkerStreamEnded(w0, "its stream closed");
  EXPECT_TRUE(l0->is_closed());
  EXPECT_TRUE(manager_->ListWorkers().empty());
  EXPECT_EQ(manager_->GetJob(job->job_id())->reason(),
            "needs 2 idle cpu workers; none registered");
}

TEST_F(JobManagerTest, ALateCallbackOfAnOldStreamSparesTheNewRegistration) {
  auto old_link = std::make_shared<FakeLink>();
  const std::string id = Register("a", old_link);
  manager_->OnWorkerStreamEnded(id, "its stream closed", old_link.get());
  // The worker reconnects and keeps its id.
  auto new_link = std::make_shared<FakeLink>();
  v1::RegisterWorker reg;
  reg.set_name("a");
  reg.set_worker_id(id);
  reg.mutable_capabilities()->set_peer_address("a:1");
  auto again = manager_->RegisterWorker(reg, new_link);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, id);
  // The old stream's callbacks, late, change nothing.
  manager_->OnWorkerStreamEnded(id, "its stream closed", old_link.get());
  ASSERT_EQ(manager_->ListWorkers().size(), 1u);
  EXPECT_FALSE(new_link->is_closed());
  // A far-off id is not granted (the counter stays small).
  auto far_link = std::make_shared<FakeLink>();
  reg.set_worker_id("w-9223372036854775807");
  auto far = manager_->RegisterWorker(reg, far_link);
  ASSERT_TRUE(far.ok());
  EXPECT_EQ(*far, "w-2");
  manager_->OnWorkerStreamEnded(id, "its stream closed", new_link.get());
  EXPECT_EQ(manager_->ListWorkers().size(), 1u);
}

using ::testing::HasSubstr;

TEST_F(JobManagerTest, AssignmentCarriesEveryStagesPlacement) {
  auto l0 = std::make_shared<FakeLink>();
  auto l1 = std::make_shared<FakeLink>();
  Register("a", l0, "cuda:0", "gpu-host-1");
  Register("b", l1, "cuda:1");  // no hostname: its peer address's host
  SubmitRunning(2, "cuda");
  for (auto* link : {l0.get(), l1.get()}) {
    ASSERT_EQ(link->sent().size(), 2u);
    const v1::StageAssignment a = link->sent()[1].assign();
    ASSERT_EQ(a.placements_size(), 2);
    EXPECT_EQ(a.placements(0).host(), "gpu-host-1");
    EXPECT_EQ(a.placements(0).device(), "cuda:0");
    EXPECT_EQ(a.placements(1).host(), "b");
    EXPECT_EQ(a.placements(1).device(), "cuda:1");
    EXPECT_EQ(a.peer_addresses(1), "b:1");  // the old field stays
  }
}

TEST_F(JobManagerTest, RendezvousGetWaitsForThePut) {
  auto l0 = std::make_shared<FakeLink>();
  auto l1 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  std::string w1 = Register("b", l1);
  const std::string job = SubmitRunning(2);
  const std::string key = job + "/nccl_id";
  RendezvousGet(w1, job, 11, key, 60000);
  EXPECT_TRUE(Replies(*l1).empty());  // waits
  RendezvousPut(w0, job, 7, key, std::string("\x00id", 3));
  auto put = Replies(*l0);
  ASSERT_EQ(put.count(7), 1u);
  EXPECT_EQ(put[7].code(), 0) << put[7].error();
  auto got = Replies(*l1);
  ASSERT_EQ(got.count(11), 1u);
  EXPECT_EQ(got[11].code(), 0) << got[11].error();
  EXPECT_EQ(got[11].value(), std::string("\x00id", 3));
  // Write-once.
  RendezvousPut(w1, job, 12, key, "other");
  auto again = Replies(*l1);
  ASSERT_EQ(again.count(12), 1u);
  EXPECT_EQ(again[12].code(),
            static_cast<int>(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(again[12].error(), HasSubstr(key));
}

TEST_F(JobManagerTest, RendezvousGetTimesOut) {
  auto l0 = std::make_shared<FakeLink>();
  auto l1 = std::make_shared<FakeLink>();
  Register("a", l0);
  std::string w1 = Register("b", l1);
  const std::string job = SubmitRunning(2);
  const absl::Time start = absl::Now();
  RendezvousGet(w1, job, 3, job + "/nccl_id", 200);
  std::optional<v1::RendezvousReply> r = WaitReply(*l1, 3);
  ASSERT_TRUE(r.has_value());
  // The liveness thread answers it, within its period (<= 100 ms) of the
  // deadline.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_EQ(r->code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(r->error(), absl::StrCat("rendezvous of job ", job, ": key \"", job,
                                     "/nccl_id\" was not put within "
                                     "200ms"));
}

TEST_F(JobManagerTest, JobEndAbortsWaitingRendezvousGets) {
  auto l0 = std::make_shared<FakeLink>();
  auto l1 = std::make_shared<FakeLink>();
  Register("a", l0);
  std::string w1 = Register("b", l1);
  const std::string job = SubmitRunning(2);
  RendezvousGet(w1, job, 4, job + "/nccl_id", 60000);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job);
  cancel.set_reason("user gave up");
  ASSERT_TRUE(manager_->CancelJob(cancel).ok());
  auto r = Replies(*l1);
  ASSERT_EQ(r.count(4), 1u);  // at once, not after 60 s
  EXPECT_EQ(r[4].code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_EQ(r[4].error(),
            absl::StrCat("rendezvous of job ", job,
                         ": closed, the job ended CANCELLED: cancelled by "
                         "request: user gave up"));
  // The store is gone with the job.
  RendezvousGet(w1, job, 5, job + "/nccl_id", 0);
  r = Replies(*l1);
  ASSERT_EQ(r.count(5), 1u);
  EXPECT_EQ(r[5].code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(r[5].error(), HasSubstr("the job is CANCELLED, not RUNNING"));
}

TEST_F(JobManagerTest, RendezvousRefusesWorkersOutsideTheJob) {
  auto l0 = std::make_shared<FakeLink>();
  auto l1 = std::make_shared<FakeLink>();
  auto l2 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  Register("b", l1);
  const std::string job = SubmitRunning(2);
  std::string idle = Register("c", l2);
  RendezvousPut(idle, job, 1, job + "/nccl_id", "forged");
  RendezvousGet(idle, job, 2, job + "/nccl_id", 1000);
  RendezvousGet(w0, "job-999", 3, "job-999/nccl_id", 1000);
  auto r = Replies(*l2);
  ASSERT_EQ(r.size(), 2u);
  for (int64_t id : {1, 2}) {
    EXPECT_EQ(r[id].code(),
              static_cast<int>(absl::StatusCode::kFailedPrecondition));
    EXPECT_EQ(r[id].error(),
              absl::StrCat("rendezvous of job ", job, ": worker ", idle,
                           " (c) runs no stage of it"));
  }
  auto unknown = Replies(*l0);
  ASSERT_EQ(unknown.count(3), 1u);
  EXPECT_EQ(unknown[3].code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(unknown[3].error(), "rendezvous of job job-999: no such job");
  // The refused Put stored nothing.
  RendezvousGet(w0, job, 4, job + "/nccl_id", 0);
  EXPECT_EQ(Replies(*l0)[4].code(),
            static_cast<int>(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(JobManagerTest, TransportChoiceIsNotedOnceInTheHistory) {
  auto l0 = std::make_shared<FakeLink>();
  auto l1 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  std::string w1 = Register("b", l1);
  const std::string job = SubmitRunning(2);
  auto report = [&](const std::string& worker, int stage,
                    const std::string& reason) {
    v1::WorkerMessage m;
    m.mutable_transport()->set_job_id(job);
    m.mutable_transport()->set_stage(stage);
    m.mutable_transport()->set_kind("tcp");
    m.mutable_transport()->set_reason(reason);
    manager_->OnWorkerMessage(worker, m);
  };
  report(w0, 0, "every stage is on cpu: using TCP");
  report(w1, 1, "every stage is on cpu: using TCP");  // same: not repeated
  report(w1, 1, "something else");  // a second report of a stage: ignored
  report(w0, 1, "not w0's stage");  // not its stage: ignored
  auto log = manager_->WatchJob(job);
  ASSERT_TRUE(log.ok());
  std::vector<v1::JobNote> notes;
  std::vector<v1::JobEvent> events;
  ASSERT_TRUE((*log)->Read(0, (*log)->size(), &events).ok());
  for (const v1::JobEvent& ev : events) {
    if (ev.has_note()) notes.push_back(ev.note());
  }
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].stage(), 0);
  EXPECT_EQ(notes[0].step(), 0);
  EXPECT_EQ(notes[0].text(), "transport: every stage is on cpu: using TCP");
}

v1::GetTraceRequest TraceRequest(const std::string& job, int64_t step) {
  v1::GetTraceRequest req;
  req.set_job_id(job);
  req.set_step(step);
  return req;
}

TEST_F(JobManagerTest, GetTraceReturnsEveryStageOfTheStep) {
  auto l0 = std::make_shared<FakeLink>();
  auto l1 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  std::string w1 = Register("b", l1);
  const std::string job = SubmitRunning(2);
  TracedStep(w1, job, 1, 1, 3);  // published first
  TracedStep(w0, job, 0, 1, 2);  // still kept for the trace
  TracedStep(w0, job, 1, 2, 2);  // not w0's stage: ignored
  auto trace = manager_->GetTrace(TraceRequest(job, 1));
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->step(), 1);
  ASSERT_EQ(trace->stages_size(), 2);
  EXPECT_EQ(trace->stages(0).stage(), 0);
  EXPECT_EQ(trace->stages(0).worker_id(), w0);
  EXPECT_EQ(trace->stages(0).worker_name(), "a");
  EXPECT_EQ(trace->stages(0).spans_size(), 2);
  EXPECT_EQ(trace->stages(1).worker_id(), w1);
  EXPECT_EQ(trace->stages(1).spans_size(), 3);
  EXPECT_EQ(trace->newest_step(), 1);
}

TEST_F(JobManagerTest, GetTraceOfAStepNoLongerHeldIsNotFound) {
  JobManagerOptions opts;
  opts.trace_limits.max_steps = 4;
  Make(opts);
  auto l0 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  const std::string job = SubmitRunning(1);
  for (int64_t step = 1; step <= 10; ++step) TracedStep(w0, job, 0, step, 1);
  auto gone = manager_->GetTrace(TraceRequest(job, 3));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(gone.status().message()),
              ::testing::HasSubstr(absl::StrCat(
                  "job ", job, ": step 3 is not held; steps 7..10 are")));
  auto newest = manager_->GetTrace(TraceRequest(job, 0));
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step(), 10);
  EXPECT_EQ(manager_->GetTrace(TraceRequest("job-99", 1)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->GetTrace(TraceRequest(job, -1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(JobManagerTest, TracesAndLogsOfAnotherUsersJobArePermissionDenied) {
  auto l0 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  const Caller alice{"alice", false};
  const Caller bob{"bob", false};
  const std::string job = SubmitRunning(1, "cpu", alice);
  TracedStep(w0, job, 0, 1, 2);
  LogLine(w0, job, 0, "hello");
  auto denied = manager_->GetTrace(TraceRequest(job, 1), bob);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(denied.status().message()),
              ::testing::HasSubstr(
                  absl::StrCat("job ", job, " belongs to another user")));
  EXPECT_EQ(manager_->WatchLogs(job, bob).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(manager_->GetTrace(TraceRequest(job, 1), alice).ok());
  EXPECT_TRUE(manager_->WatchLogs(job, alice).ok());
  EXPECT_TRUE(
      manager_->GetTrace(TraceRequest(job, 1), Caller{"ops", true}).ok());
}

// Request ids are per owner; an owner-less job (--insecure) whose request
// id happens to be "alice:r1" is not alice's "r1".
TEST_F(JobManagerTest, RequestIdsArePerOwnerAndNeverCrossOwners) {
  v1::SubmitJobRequest req;
  *req.mutable_spec() = Spec(1);
  req.set_request_id("alice:r1");
  auto anonymous = manager_->SubmitJob(req);  // the default: anonymous admin
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  req.set_request_id("r1");
  auto alices = manager_->SubmitJob(req, Caller{"alice", false});
  EXPECT_EQ(alices.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(alices.status().message()),
              ::testing::HasSubstr("request_id: already used by another job"));
  req.set_request_id("r2");
  auto bobs = manager_->SubmitJob(req, Caller{"bob", false});
  ASSERT_TRUE(bobs.ok());
  EXPECT_EQ(bobs->owner(), "bob");
  auto again = manager_->SubmitJob(req, Caller{"bob", false});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->job_id(), bobs->job_id());
  auto other = manager_->SubmitJob(req, Caller{"carol", false});
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->job_id(), bobs->job_id());
}

TEST_F(JobManagerTest, LogLinesOfTheJobsStagesAreKeptWithTheirWorker) {
  auto l0 = std::make_shared<FakeLink>();
  auto l1 = std::make_shared<FakeLink>();
  auto l2 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  std::string w1 = Register("b", l1);
  const std::string job = SubmitRunning(2);
  std::string idle = Register("c", l2);
  LogLine(w0, job, 0, "stage 0 started");
  LogLine(w1, job, 1, "stage 1 started");
  LogLine(w0, job, 1, "not w0's stage");
  LogLine(idle, job, 0, "from a worker outside the job");
  LogLine(w0, "job-99", 0, "another job");
  std::vector<v1::LogLine> lines = Lines(job);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].seq(), 0);
  EXPECT_EQ(lines[0].stage(), 0);
  EXPECT_EQ(lines[0].worker_id(), w0);
  EXPECT_EQ(lines[0].worker_name(), "a");
  EXPECT_EQ(lines[0].time_ms(), 1700000000123);
  EXPECT_EQ(lines[0].text(), "stage 0 started");
  EXPECT_EQ(lines[1].stage(), 1);
  EXPECT_EQ(lines[1].worker_id(), w1);
  // Each line is cut at 1 KiB.
  LogLine(w0, job, 0, std::string(5000, 'x'));
  EXPECT_EQ(Lines(job).back().text().size(), 1024u);
}

TEST_F(JobManagerTest, LogRingIsBounded) {
  JobManagerOptions opts;
  opts.log_limits.max_lines = 50;
  opts.log_burst = 1e9;
  Make(opts);
  auto l0 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  const std::string job = SubmitRunning(1);
  for (int i = 0; i < 500; ++i) LogLine(w0, job, 0, absl::StrCat("line ", i));
  std::vector<v1::LogLine> lines = Lines(job);
  ASSERT_EQ(lines.size(), 50u);
  EXPECT_EQ(lines.front().seq(), 450);
  EXPECT_EQ(lines.front().text(), "line 450");
  EXPECT_EQ(lines.back().seq(), 499);
}

TEST_F(JobManagerTest, AWorkerBeyondTheLogRateLosesLinesAndIsToldSo) {
  JobManagerOptions opts;
  opts.log_burst = 5;
  opts.log_lines_per_second = 20;
  Make(opts);
  auto l0 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  const std::string job = SubmitRunning(1);
  for (int i = 0; i < 1000; ++i) LogLine(w0, job, 0, absl::StrCat("spam ", i));
  const size_t taken = Lines(job).size();
  EXPECT_GE(taken, 5u);
  EXPECT_LT(taken, 50u);
  absl::SleepFor(absl::Milliseconds(200));  // a few tokens come back
  LogLine(w0, job, 0, "after the burst");
  std::vector<v1::LogLine> lines = Lines(job);
  ASSERT_EQ(lines.size(), taken + 2);
  EXPECT_THAT(
      lines[taken].text(),
      ::testing::MatchesRegex("\\(controller\\) [0-9]+ line\\(s\\) from worker "
                              "w-1 \\(a\\) dropped: more than 20 lines/s"));
  EXPECT_EQ(lines[taken].severity(), v1::LOG_SEVERITY_WARNING);
  EXPECT_EQ(lines.back().text(), "after the burst");
}

TEST_F(JobManagerTest, LogsEndWithTheJobAndOnlyTheNewestEndedJobsKeepThem) {
  JobManagerOptions opts;
  opts.keep_ended_jobs = 1;
  Make(opts);
  auto l0 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  const std::string first = SubmitRunning(1);
  LogLine(w0, first, 0, "first job");
  TracedStep(w0, first, 0, 1, 1);
  auto ring = manager_->WatchLogs(first);
  ASSERT_TRUE(ring.ok());
  v1::CancelJobRequest cancel;
  cancel.set_job_id(first);
  ASSERT_TRUE(manager_->CancelJob(cancel).ok());
  EXPECT_TRUE((*ring)->state().closed);
  // Still kept: it is the one ended job kept.
  EXPECT_EQ(Lines(first).size(), 1u);
  EXPECT_TRUE(manager_->GetTrace(TraceRequest(first, 1)).ok());

  const std::string second = SubmitRunning(1);
  LogLine(w0, second, 0, "second job");
  cancel.set_job_id(second);
  ASSERT_TRUE(manager_->CancelJob(cancel).ok());
  auto gone = manager_->WatchLogs(first);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(gone.status().message()),
              ::testing::HasSubstr("no longer kept"));
  EXPECT_EQ(manager_->GetTrace(TraceRequest(first, 1)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Lines(second).size(), 1u);
  // The ring the first job's reader holds stays readable.
  int64_t seq = 0;
  v1::LogLine line;
  EXPECT_TRUE((*ring)->Read(&seq, &line));
  EXPECT_EQ(line.text(), "first job");
}

TEST(JobManagerOptionsTest, NoEventsInMemoryIsRefused) {
  JobManagerOptions opts;
  opts.data_dir = std::string(getenv("TEST_TMPDIR")) + "/no_events";
  opts.events_in_memory = 0;
  auto manager = JobManager::Create(opts);
  EXPECT_EQ(manager.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager.status().message(),
            "events_in_memory must be at least 1, got 0");
}

// A job's events beyond events_in_memory live only in the store, and an
// ended job's leave memory with its other state (keep_ended_jobs); every
// read still gets the whole history, in order.
TEST_F(JobManagerTest, EventsBeyondMemoryAndEndedJobsEventsComeFromTheStore) {
  JobManagerOptions opts;
  opts.keep_ended_jobs = 1;
  opts.events_in_memory = 4;
  Make(opts);
  auto l0 = std::make_shared<FakeLink>();
  std::string w0 = Register("a", l0);
  const std::string first = SubmitRunning(1);
  for (int64_t step = 1; step <= 10; ++step) Step(w0, first, 0, step);
  auto held = manager_->WatchJob(first);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ((*held)->first_in_memory(), (*held)->size() - 4);
  auto history = [](const JobEventLog& log) {
    std::vector<v1::JobEvent> events;
    while (static_cast<int64_t>(events.size()) < log.size()) {
      const size_t before = events.size();
      EXPECT_TRUE(log.Read(before, 3, &events).ok());
      if (events.size() == before) break;
    }
    std::vector<std::string> out;
    for (const v1::JobEvent& e : events) {
      if (e.has_step()) out.push_back(absl::StrCat("step ", e.step().step()));
      if (e.has_state()) out.push_back(v1::JobState_Name(e.state().state()));
    }
    return out;
  };
  v1::CancelJobRequest cancel;
  cancel.set_job_id(first);
  ASSERT_TRUE(manager_->CancelJob(cancel).ok());
  const std::vector<std::string> want = {
      "QUEUED", "RUNNING", "step 1", "step 2", "step 3",  "step 4",   "step 5",
      "step 6", "step 7",  "step 8", "step 9", "step 10", "CANCELLED"};
  EXPECT_EQ(history(**held), want);
  // Still the one ended job kept: the same log.
  EXPECT_EQ(manager_->WatchJob(first)->get(), held->get());

  const std::string second = SubmitRunning(1);
  LogLine(w0, second, 0, "second job");
  cancel.set_job_id(second);
  ASSERT_TRUE(manager_->CancelJob(cancel).ok());
  // The first job's log left memory; loaded again, it has the same events.
  auto again = manager_->WatchJob(first);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->get(), held->get());
  EXPECT_EQ((*again)->size(), (*held)->size());
  EXPECT_EQ((*again)->first_in_memory(), (*again)->size() - 4);
  EXPECT_EQ(history(**again), want);
  EXPECT_EQ(history(**held), want);  // a watcher's copy stays readable
  // Loading it cost the newest ended job none of its log lines.
  EXPECT_EQ(Lines(second).size(), 1u);
}

}  // namespace
}  // namespace trainyard
