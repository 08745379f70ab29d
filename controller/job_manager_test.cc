// JobManager without gRPC: workers are fake WorkerLinks, so message order is
// exactly the order of the calls.
#include "controller/job_manager.h"

#include <stdlib.h>

#include <mutex>

#include "absl/strings/str_format.h"
#include "core/job_plan.h"
#include "gtest/gtest.h"

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
  void SetUp() override {
    std::string tmpl = std::string(getenv("TEST_TMPDIR")) + "/jm_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    JobManagerOptions opts;
    opts.data_dir = tmpl;
    auto m = JobManager::Create(opts);
    ASSERT_TRUE(m.ok()) << m.status();
    manager_ = *std::move(m);
  }
  std::string Register(const std::string& name,
                       std::shared_ptr<FakeLink> link) {
    v1::RegisterWorker reg;
    reg.set_name(name);
    reg.mutable_capabilities()->set_device("cpu");
    reg.mutable_capabilities()->set_peer_address(name + ":1");
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
  std::unique_ptr<JobManager> manager_;
};

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
  v1::JobEvent ev;
  for (int64_t i = 0; (*log)->Read(i, &ev); ++i) {
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
  auto done = manager_->GetJob(job->job_id());
  EXPECT_EQ(done->state(), v1::FAILED);
  EXPECT_NE(done->reason().find("out of memory"), std::string::npos);
  // Both workers are idle again.
  for (const auto& w : manager_->ListWorkers()) EXPECT_TRUE(w.job_id.empty());
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

}  // namespace
}  // namespace trainyard
