// In-process tests of the controller over real gRPC on 127.0.0.1: JobService
// stubs as users, WorkerService streams as fake workers.
#include "controller/controller_service.h"

#include <stdlib.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "plan/job_plan.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "gtest/gtest.h"
#include "security/tokens.h"

namespace trainyard {
namespace {

using v1::ControllerMessage;
using v1::Job;
using v1::JobEvent;
using v1::WorkerMessage;

std::string TempDir() {
  std::string tmpl =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
      "/controller_XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

// A valid spec with `stages` pipeline stages on `device`; max_restarts >= 0
// sets recovery.max_restarts (with no backoff).
v1::JobSpec Spec(int stages, int steps = 20, const std::string& device = "",
                 int max_restarts = -1) {
  std::string blocks;
  for (int i = 0; i < stages; ++i) {
    absl::StrAppend(&blocks, i ? "," : "",
                    R"({"outFeatures": 8, "ffnHiddenSize": 16})");
  }
  std::string json = absl::StrFormat(
      R"({"name": "t", "steps": %d, "model": {"blocks": [%s]},
          "parallelism": {"stages": %d},
          "optimizer": {"lr": 0.01},
          "task": {"plugin": "cross_entropy"},
          "data": {"train": {"synthetic": {"kind": "gaussian_blobs",
              "numSamples": 64, "numFeatures": 8, "numOutputs": 8}},
              "batchSize": 8}%s%s})",
      steps, blocks, stages,
      device.empty() ? "" : absl::StrCat(R"(, "device": ")", device, "\""),
      max_restarts < 0 ? ""
                       : absl::StrCat(R"(, "recovery": {"maxRestarts": )",
                                      max_restarts, R"(, "backoffMs": 0})"));
  auto spec = ParseJobSpecJson(json, "test spec");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// A worker daemon stand-in: one Connect stream, a reader thread queueing
// everything the controller sends, optional heartbeats.
class FakeWorker {
 public:
  // `previous_id` and `claim` (when its job_id is set) are what a
  // reconnecting worker sends in RegisterWorker.
  FakeWorker(const std::shared_ptr<grpc::Channel>& channel, std::string name,
             std::string device = "cpu", const std::string& previous_id = "",
             const v1::StageClaim& claim = v1::StageClaim())
      : name_(std::move(name)),
        peer_(absl::StrCat(name_, ".peer:9000")),
        stub_(v1::WorkerService::NewStub(channel)) {
    stream_ = stub_->Connect(&ctx_);
    reader_ = std::thread([this] {
      ControllerMessage msg;
      while (stream_->Read(&msg)) {
        std::lock_guard<std::mutex> l(mu_);
        inbox_.push_back(msg);
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> l(mu_);
      ended_ = true;
      cv_.notify_all();
    });
    WorkerMessage reg;
    reg.mutable_register_()->set_name(name_);
    reg.mutable_register_()->mutable_capabilities()->set_device(device);
    reg.mutable_register_()->mutable_capabilities()->set_peer_address(peer_);
    reg.mutable_register_()->set_worker_id(previous_id);
    if (!claim.job_id().empty())
      *reg.mutable_register_()->mutable_running() = claim;
    Send(reg);
    std::optional<ControllerMessage> m = Next();
    EXPECT_TRUE(m && m->has_registered());
    if (m) id_ = m->registered().worker_id();
    heartbeat_ = std::thread([this] {
      std::unique_lock<std::mutex> l(mu_);
      while (!stop_) {
        if (beating_) {
          l.unlock();
          WorkerMessage hb;
          hb.mutable_heartbeat()->set_time_ms(absl::ToUnixMillis(absl::Now()));
          Send(hb);
          l.lock();
        }
        cv_.wait_for(l, std::chrono::milliseconds(100));
      }
    });
  }
  ~FakeWorker() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    heartbeat_.join();
    ctx_.TryCancel();
    reader_.join();
    stream_->Finish().IgnoreError();
  }

  const std::string& id() const { return id_; }
  const std::string& name() const { return name_; }
  const std::string& peer() const { return peer_; }

  void Send(const WorkerMessage& msg) {
    std::lock_guard<std::mutex> l(write_mu_);
    if (!closed_) stream_->Write(msg);
  }
  void StopHeartbeats() {
    std::lock_guard<std::mutex> l(mu_);
    beating_ = false;
  }
  // The worker process "dies": its stream is cancelled.
  void Crash() {
    StopHeartbeats();
    {
      std::lock_guard<std::mutex> l(write_mu_);
      closed_ = true;
    }
    ctx_.TryCancel();
  }

  // The next message from the controller, or nullopt after `timeout`.
  std::optional<ControllerMessage> Next(
      absl::Duration timeout = absl::Seconds(5)) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, absl::ToChronoMilliseconds(timeout),
                 [&] { return !inbox_.empty() || ended_; });
    if (inbox_.empty()) return std::nullopt;
    ControllerMessage m = inbox_.front();
    inbox_.pop_front();
    return m;
  }
  bool StreamEnded(absl::Duration timeout) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, absl::ToChronoMilliseconds(timeout),
                        [&] { return ended_; });
  }

  void Step(const std::string& job, int stage, int64_t step, double loss,
            int num_metrics = 0) {
    WorkerMessage m;
    m.mutable_step()->set_job_id(job);
    m.mutable_step()->set_stage(stage);
    v1::StepMetrics* s = m.mutable_step()->mutable_step();
    s->set_step(step);
    s->set_loss(loss);
    v1::StageTiming* t = s->add_stages();
    t->set_stage(stage);
    t->set_forward_s(0.001 * (stage + 1));
    for (int i = 0; i < num_metrics; ++i) {
      (*s->mutable_metrics())[absl::StrCat("a_rather_long_metric_name_", i)] =
          i;
    }
    Send(m);
  }
  void RendezvousPut(const std::string& job, int64_t id, const std::string& key,
                     const std::string& value) {
    WorkerMessage m;
    m.mutable_rendezvous_put()->set_request_id(id);
    m.mutable_rendezvous_put()->set_job_id(job);
    m.mutable_rendezvous_put()->set_key(key);
    m.mutable_rendezvous_put()->set_value(value);
    Send(m);
  }
  void RendezvousGet(const std::string& job, int64_t id, const std::string& key,
                     int64_t timeout_ms) {
    WorkerMessage m;
    m.mutable_rendezvous_get()->set_request_id(id);
    m.mutable_rendezvous_get()->set_job_id(job);
    m.mutable_rendezvous_get()->set_key(key);
    m.mutable_rendezvous_get()->set_timeout_ms(timeout_ms);
    Send(m);
  }
  void ReportTransport(const std::string& job, int stage,
                       const std::string& reason) {
    WorkerMessage m;
    m.mutable_transport()->set_job_id(job);
    m.mutable_transport()->set_stage(stage);
    m.mutable_transport()->set_kind("nccl");
    m.mutable_transport()->set_reason(reason);
    Send(m);
  }
  void Done(const std::string& job, int stage, bool ok = true,
            const std::string& error = "", bool cancelled = false,
            absl::StatusCode code = absl::StatusCode::kUnknown) {
    WorkerMessage m;
    m.mutable_done()->set_job_id(job);
    m.mutable_done()->set_stage(stage);
    m.mutable_done()->set_ok(ok);
    m.mutable_done()->set_error(error);
    m.mutable_done()->set_cancelled(cancelled);
    if (!ok) m.mutable_done()->set_code(static_cast<int>(code));
    Send(m);
  }
  void Held(const std::string& job, int stage, int64_t step) {
    WorkerMessage m;
    m.mutable_held()->set_job_id(job);
    m.mutable_held()->set_stage(stage);
    m.mutable_held()->set_step(step);
    Send(m);
  }
  void Log(const std::string& job, int stage, const std::string& text) {
    WorkerMessage m;
    m.mutable_log()->set_job_id(job);
    m.mutable_log()->set_stage(stage);
    m.mutable_log()->set_time_ms(absl::ToUnixMillis(absl::Now()));
    m.mutable_log()->set_text(text);
    Send(m);
  }
  // A step report whose trace has one forward span per microbatch.
  void TracedStep(const std::string& job, int stage, int64_t step,
                  int microbatches) {
    WorkerMessage m;
    m.mutable_step()->set_job_id(job);
    m.mutable_step()->set_stage(stage);
    m.mutable_step()->mutable_step()->set_step(step);
    v1::StageTrace* t = m.mutable_step()->mutable_trace();
    t->set_step_us(1000);
    for (int i = 0; i < microbatches; ++i) {
      v1::StageSpan* span = t->add_spans();
      span->set_kind(v1::SPAN_FORWARD);
      span->set_microbatch(i);
      span->set_start_us(100 * i);
      span->set_end_us(100 * i + 80);
    }
    Send(m);
  }
  void Started(const std::string& job, int stage, int64_t resume_step) {
    WorkerMessage m;
    m.mutable_started()->set_job_id(job);
    m.mutable_started()->set_stage(stage);
    m.mutable_started()->set_resume_step(resume_step);
    Send(m);
  }

 private:
  const std::string name_;
  const std::string peer_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<WorkerMessage, ControllerMessage>>
      stream_;
  std::string id_;
  std::mutex write_mu_;
  bool closed_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ControllerMessage> inbox_;
  bool ended_ = false;
  bool stop_ = false;
  bool beating_ = true;
  std::thread reader_;
  std::thread heartbeat_;
};

// Reads a whole WatchJob stream on its own thread.
class Watcher {
 public:
  Watcher(v1::JobService::Stub* stub, const std::string& job_id,
          int64_t from_step = 0, bool read = true) {
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    req.set_from_step(from_step);
    reader_ = stub->WatchJob(&ctx_, req);
    if (read) Start();
  }
  ~Watcher() {
    ctx_.TryCancel();
    if (thread_.joinable()) thread_.join();
  }
  void Start() {
    thread_ = std::thread([this] {
      JobEvent ev;
      while (reader_->Read(&ev)) {
        std::lock_guard<std::mutex> l(mu_);
        events_.push_back(ev);
        cv_.notify_all();
      }
      grpc::Status st = reader_->Finish();
      std::lock_guard<std::mutex> l(mu_);
      status_ = st;
      done_ = true;
      cv_.notify_all();
    });
  }
  // Waits for the stream to end; returns its status.
  grpc::Status Wait(absl::Duration timeout = absl::Seconds(10)) {
    std::unique_lock<std::mutex> l(mu_);
    EXPECT_TRUE(cv_.wait_for(l, absl::ToChronoMilliseconds(timeout), [&] {
      return done_;
    })) << "watch stream did not end";
    return status_;
  }
  bool WaitForSteps(int64_t last_step, absl::Duration timeout) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, absl::ToChronoMilliseconds(timeout), [&] {
      return !events_.empty() && events_.back().has_step() &&
             events_.back().step().step() >= last_step;
    });
  }
  std::vector<JobEvent> events() {
    std::lock_guard<std::mutex> l(mu_);
    return events_;
  }
  std::vector<int64_t> steps() {
    std::vector<int64_t> out;
    for (const JobEvent& e : events()) {
      if (e.has_step()) out.push_back(e.step().step());
    }
    return out;
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<JobEvent>> reader_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<JobEvent> events_;
  bool done_ = false;
  grpc::Status status_;
};

std::vector<int64_t> Range(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i <= to; ++i) v.push_back(i);
  return v;
}

class ControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    StartServer();
  }
  void TearDown() override { server_.reset(); }

  void StartServer(absl::Duration adopt_timeout = absl::Seconds(10),
                   const std::string& tokens_file = "") {
    ControllerOptions opts;
    opts.data_dir = dir_;
    opts.tokens_file = tokens_file;
    opts.heartbeat_interval = absl::Milliseconds(100);
    opts.heartbeat_timeout = absl::Milliseconds(800);
    opts.adopt_timeout = adopt_timeout;
    opts.drain_timeout = absl::Seconds(1);
    auto server = ControllerServer::Start(opts);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(),
                                   grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel_);
  }

  grpc::Status TrySubmit(const std::string& request_id, const v1::JobSpec& spec,
                         Job* job, int priority = 0) {
    v1::SubmitJobRequest req;
    req.set_request_id(request_id);
    *req.mutable_spec() = spec;
    req.set_priority(priority);
    grpc::ClientContext ctx;
    return jobs_->SubmitJob(&ctx, req, job);
  }
  Job Submit(const std::string& request_id, const v1::JobSpec& spec,
             int priority = 0) {
    Job job;
    grpc::Status st = TrySubmit(request_id, spec, &job, priority);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return job;
  }
  Job Get(const std::string& job_id) {
    v1::GetJobRequest req;
    req.set_job_id(job_id);
    grpc::ClientContext ctx;
    Job job;
    grpc::Status st = jobs_->GetJob(&ctx, req, &job);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return job;
  }
  grpc::Status Cancel(const std::string& job_id, Job* job,
                      const std::string& reason = "") {
    v1::CancelJobRequest req;
    req.set_job_id(job_id);
    req.set_reason(reason);
    grpc::ClientContext ctx;
    return jobs_->CancelJob(&ctx, req, job);
  }
  // Polls GetJob until `pred` holds; returns the last job seen.
  Job WaitJob(const std::string& job_id, std::function<bool(const Job&)> pred,
              absl::Duration timeout = absl::Seconds(5)) {
    absl::Time deadline = absl::Now() + timeout;
    Job job = Get(job_id);
    while (!pred(job) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
      job = Get(job_id);
    }
    EXPECT_TRUE(pred(job)) << job.DebugString();
    return job;
  }
  Job WaitState(const std::string& job_id, v1::JobState state) {
    return WaitJob(job_id, [&](const Job& j) { return j.state() == state; });
  }
  std::unique_ptr<FakeWorker> NewWorker(const std::string& name,
                                        const std::string& device = "cpu") {
    return std::make_unique<FakeWorker>(channel_, name, device);
  }

  std::string dir_;
  std::unique_ptr<ControllerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

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
    EXPECT_EQ(m->assign().stage(), k);
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
  EXPECT_EQ(b0->assign().stage(), 0);
  EXPECT_EQ(b1->assign().stage(), 1);
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
  EXPECT_EQ(a0->assign().stage(), 0);
  EXPECT_EQ(a1->assign().stage(), 1);
  EXPECT_EQ(a2->assign().stage(), 2);
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
}  // namespace trainyard
