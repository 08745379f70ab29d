// The fixture of the in-process controller tests (controller_service_test.cc,
// controller_recovery_test.cc): a ControllerServer over real gRPC on
// 127.0.0.1, JobService stubs as users, and FakeWorker, a worker daemon
// stand-in on a WorkerService stream.
#ifndef TRAINYARD_CONTROLLER_CONTROLLER_TEST_FIXTURE_H_
#define TRAINYARD_CONTROLLER_CONTROLLER_TEST_FIXTURE_H_

#include <stdlib.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "controller/controller_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "plan/job_plan.h"
#include "proto/trainyard.grpc.pb.h"

namespace trainyard {
namespace controller_test {

inline std::string TempDir() {
  std::string tmpl =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
      "/controller_XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

// A valid spec with `stages` pipeline stages on `device`; max_restarts >= 0
// sets recovery.max_restarts (with no backoff).
inline v1::JobSpec Spec(int stages, int steps = 20,
                        const std::string& device = "", int max_restarts = -1) {
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
      v1::ControllerMessage msg;
      while (stream_->Read(&msg)) {
        std::lock_guard<std::mutex> l(mu_);
        inbox_.push_back(msg);
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> l(mu_);
      ended_ = true;
      cv_.notify_all();
    });
    v1::WorkerMessage reg;
    reg.mutable_register_()->set_name(name_);
    reg.mutable_register_()->mutable_capabilities()->set_device(device);
    reg.mutable_register_()->mutable_capabilities()->set_peer_address(peer_);
    reg.mutable_register_()->set_worker_id(previous_id);
    if (!claim.job_id().empty())
      *reg.mutable_register_()->mutable_running() = claim;
    Send(reg);
    std::optional<v1::ControllerMessage> m = Next();
    EXPECT_TRUE(m && m->has_registered());
    if (m) id_ = m->registered().worker_id();
    heartbeat_ = std::thread([this] {
      std::unique_lock<std::mutex> l(mu_);
      while (!stop_) {
        if (beating_) {
          l.unlock();
          v1::WorkerMessage hb;
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

  void Send(const v1::WorkerMessage& msg) {
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
  std::optional<v1::ControllerMessage> Next(
      absl::Duration timeout = absl::Seconds(5)) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, absl::ToChronoMilliseconds(timeout),
                 [&] { return !inbox_.empty() || ended_; });
    if (inbox_.empty()) return std::nullopt;
    v1::ControllerMessage m = inbox_.front();
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
    v1::WorkerMessage m;
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
    v1::WorkerMessage m;
    m.mutable_rendezvous_put()->set_request_id(id);
    m.mutable_rendezvous_put()->set_job_id(job);
    m.mutable_rendezvous_put()->set_key(key);
    m.mutable_rendezvous_put()->set_value(value);
    Send(m);
  }
  void RendezvousGet(const std::string& job, int64_t id, const std::string& key,
                     int64_t timeout_ms) {
    v1::WorkerMessage m;
    m.mutable_rendezvous_get()->set_request_id(id);
    m.mutable_rendezvous_get()->set_job_id(job);
    m.mutable_rendezvous_get()->set_key(key);
    m.mutable_rendezvous_get()->set_timeout_ms(timeout_ms);
    Send(m);
  }
  void ReportTransport(const std::string& job, int stage,
                       const std::string& reason) {
    v1::WorkerMessage m;
    m.mutable_transport()->set_job_id(job);
    m.mutable_transport()->set_stage(stage);
    m.mutable_transport()->set_kind("nccl");
    m.mutable_transport()->set_reason(reason);
    Send(m);
  }
  void Done(const std::string& job, int stage, bool ok = true,
            const std::string& error = "", bool cancelled = false,
            absl::StatusCode code = absl::StatusCode::kUnknown) {
    v1::WorkerMessage m;
    m.mutable_done()->set_job_id(job);
    m.mutable_done()->set_stage(stage);
    m.mutable_done()->set_ok(ok);
    m.mutable_done()->set_error(error);
    m.mutable_done()->set_cancelled(cancelled);
    if (!ok) m.mutable_done()->set_code(static_cast<int>(code));
    Send(m);
  }
  void Held(const std::string& job, int stage, int64_t step) {
    v1::WorkerMessage m;
    m.mutable_held()->set_job_id(job);
    m.mutable_held()->set_stage(stage);
    m.mutable_held()->set_step(step);
    Send(m);
  }
  void Log(const std::string& job, int stage, const std::string& text) {
    v1::WorkerMessage m;
    m.mutable_log()->set_job_id(job);
    m.mutable_log()->set_stage(stage);
    m.mutable_log()->set_time_ms(absl::ToUnixMillis(absl::Now()));
    m.mutable_log()->set_text(text);
    Send(m);
  }
  // A step report whose trace has one forward span per microbatch.
  void TracedStep(const std::string& job, int stage, int64_t step,
                  int microbatches) {
    v1::WorkerMessage m;
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
    v1::WorkerMessage m;
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
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::WorkerMessage, v1::ControllerMessage>>
      stream_;
  std::string id_;
  std::mutex write_mu_;
  bool closed_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::ControllerMessage> inbox_;
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
      v1::JobEvent ev;
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
  std::vector<v1::JobEvent> events() {
    std::lock_guard<std::mutex> l(mu_);
    return events_;
  }
  std::vector<int64_t> steps() {
    std::vector<int64_t> out;
    for (const v1::JobEvent& e : events()) {
      if (e.has_step()) out.push_back(e.step().step());
    }
    return out;
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::JobEvent> events_;
  bool done_ = false;
  grpc::Status status_;
};

inline std::vector<int64_t> Range(int64_t from, int64_t to) {
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
    opts.events_in_memory = events_in_memory_;
    auto server = ControllerServer::Start(opts);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(),
                                   grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel_);
  }

  grpc::Status TrySubmit(const std::string& request_id, const v1::JobSpec& spec,
                         v1::Job* job, int priority = 0) {
    v1::SubmitJobRequest req;
    req.set_request_id(request_id);
    *req.mutable_spec() = spec;
    req.set_priority(priority);
    grpc::ClientContext ctx;
    return jobs_->SubmitJob(&ctx, req, job);
  }
  v1::Job Submit(const std::string& request_id, const v1::JobSpec& spec,
                 int priority = 0) {
    v1::Job job;
    grpc::Status st = TrySubmit(request_id, spec, &job, priority);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return job;
  }
  v1::Job Get(const std::string& job_id) {
    v1::GetJobRequest req;
    req.set_job_id(job_id);
    grpc::ClientContext ctx;
    v1::Job job;
    grpc::Status st = jobs_->GetJob(&ctx, req, &job);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return job;
  }
  grpc::Status Cancel(const std::string& job_id, v1::Job* job,
                      const std::string& reason = "") {
    v1::CancelJobRequest req;
    req.set_job_id(job_id);
    req.set_reason(reason);
    grpc::ClientContext ctx;
    return jobs_->CancelJob(&ctx, req, job);
  }
  // Polls GetJob until `pred` holds; returns the last job seen.
  v1::Job WaitJob(const std::string& job_id,
                  std::function<bool(const v1::Job&)> pred,
                  absl::Duration timeout = absl::Seconds(5)) {
    absl::Time deadline = absl::Now() + timeout;
    v1::Job job = Get(job_id);
    while (!pred(job) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
      job = Get(job_id);
    }
    EXPECT_TRUE(pred(job)) << job.DebugString();
    return job;
  }
  v1::Job WaitState(const std::string& job_id, v1::JobState state) {
    return WaitJob(job_id,
                   [&](const v1::Job& j) { return j.state() == state; });
  }
  std::unique_ptr<FakeWorker> NewWorker(const std::string& name,
                                        const std::string& device = "cpu") {
    return std::make_unique<FakeWorker>(channel_, name, device);
  }

  std::string dir_;
  int64_t events_in_memory_ = 4096;  // set before a StartServer
  std::unique_ptr<ControllerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

}  // namespace controller_test
}  // namespace trainyard

#endif  // TRAINYARD_CONTROLLER_CONTROLLER_TEST_FIXTURE_H_
