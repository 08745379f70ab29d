// The worker daemon against a fake controller served in-process on
// 127.0.0.1: registration, heartbeats, step/eval/done reports, bad
// assignments, cancellation, reconnection, the health service, and the
// transport choice; then against the real controller (in-process, real
// gRPC streams) for the NCCL rendezvous.
#include "worker/worker_daemon.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "controller/controller_service.h"
#include "plan/job_plan.h"
#include "transport/nccl_transport.h"
#include "transport/transport_select.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/exec_context.h"
#include "proto/trainyard.grpc.pb.h"
#include "proto/trainyard.pb.h"
#include "engine/local_job.h"
#include "engine/test_paths.h"
#include "worker/stage_transport.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using ::trainyard::v1::ControllerMessage;
using ::trainyard::v1::JobSpec;
using ::trainyard::v1::WorkerMessage;

constexpr int64_t kHeartbeatMs = 50;

using testing::PluginDir;
using testing::TempDir;

// What the fake controller heard from one worker.
struct Heard {
  std::string worker_id;
  WorkerMessage message;
};

// A controller that registers every worker, records everything workers
// send, and sends what the test tells it to.
class FakeController final : public trainyard::v1::WorkerService::Service {
 public:
  using Stream = grpc::ServerReaderWriter<ControllerMessage, WorkerMessage>;

  // Serves on `address` ("127.0.0.1:0" for a free port).
  explicit FakeController(const std::string& address) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FakeController() override { Stop(); }

  bool ok() const { return server_ != nullptr && port_ > 0; }
  // Sent in WorkerRegistered (0: workers never give up their stage).
  void set_adopt_timeout_ms(int64_t ms) { adopt_timeout_ms_ = ms; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  // Ends every stream at once, like a controller that dies.
  void Stop() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
  }

  grpc::Status Connect(grpc::ServerContext*, Stream* stream) override {
    WorkerMessage first;
    if (!stream->Read(&first) || !first.has_register_()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "first message must be RegisterWorker");
    }
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      id = absl::StrCat("w", ++connects_);
      streams_[id] = stream;
    }
    ControllerMessage reply;
    reply.mutable_registered()->set_worker_id(id);
    reply.mutable_registered()->set_heartbeat_interval_ms(kHeartbeatMs);
    reply.mutable_registered()->set_heartbeat_timeout_ms(10 * kHeartbeatMs);
    reply.mutable_registered()->set_adopt_timeout_ms(adopt_timeout_ms_);
    Send(id, reply);
    {
      // Counted only once the reply is out, so nothing the test sends can
      // overtake it.
      absl::MutexLock lock(&mu_);
      ++registrations_;
      registered_.push_back(first.register_());
      worker_ids_.push_back(id);
    }
    WorkerMessage message;
    while (stream->Read(&message)) {
      absl::MutexLock lock(&mu_);
      heard_.push_back({id, message});
    }
    absl::MutexLock lock(&mu_);
    streams_.erase(id);
    return grpc::Status::OK;
  }

  bool Send(const std::string& worker_id, const ControllerMessage& message) {
    absl::MutexLock lock(&write_mu_);
    Stream* stream;
    {
      absl::MutexLock lock2(&mu_);
      auto it = streams_.find(worker_id);
      if (it == streams_.end()) return false;
      stream = it->second;
    }
    return stream->Write(message);
  }

  // Waits for the n-th registration (1-based) and returns its worker id.
  std::string WaitForRegistration(int n,
                                  absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return registrations_ >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return registrations_ >= n ? worker_ids_[n - 1] : "";
  }

  // Waits for StageDone of `job_id` and returns it (nullopt on timeout).
  std::optional<trainyard::v1::StageDone> WaitForDone(
      const std::string& job_id, absl::Duration timeout = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto find = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      for (const Heard& h : heard_) {
        if (h.message.has_done() && h.message.done().job_id() == job_id) {
          return true;
        }
      }
      return false;
    };
    mu_.AwaitWithTimeout(absl::Condition(&find), timeout);
    for (const Heard& h : heard_) {
      if (h.message.has_done() && h.message.done().job_id() == job_id) {
        return h.message.done();
      }
    }
    return std::nullopt;
  }

  // Waits until `job_id` has reported `count` step reports.
  bool WaitForSteps(const std::string& job_id, int count,
                    absl::Duration timeout = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      int n = 0;
      for (const Heard& h : heard_) {
        n += h.message.has_step() && h.message.step().job_id() == job_id;
      }
      return n >= count;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

  int Heartbeats(const std::string& worker_id) {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const Heard& h : heard_) {
      n += h.worker_id == worker_id && h.message.has_heartbeat();
    }
    return n;
  }

  std::vector<Heard> heard() {
    absl::MutexLock lock(&mu_);
    return heard_;
  }
  // In registration order, matching worker_ids().
  std::vector<trainyard::v1::RegisterWorker> registered() {
    absl::MutexLock lock(&mu_);
    return registered_;
  }
  std::vector<std::string> worker_ids() {
    absl::MutexLock lock(&mu_);
    return worker_ids_;
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex write_mu_;  // one writer per stream at a time
  absl::Mutex mu_;
  int connects_ ABSL_GUARDED_BY(mu_) = 0;
  int registrations_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> worker_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<trainyard::v1::RegisterWorker> registered_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Stream*> streams_ ABSL_GUARDED_BY(mu_);
  std::vector<Heard> heard_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> adopt_timeout_ms_{0};
};

JobSpec SmallSpec(int64_t steps) {
  JobSpec spec;
  spec.set_name("worker-test");
  spec.set_steps(steps);
  spec.set_seed(11);
  for (int out : {16, 4}) {
    auto* block = spec.mutable_model()->add_blocks();
    block->set_out_features(out);
    block->set_ffn_hidden_size(24);
    block->set_activation("gelu");
    block->set_norm("layernorm");
  }
  spec.mutable_parallelism()->set_microbatches(2);
  spec.mutable_optimizer()->set_lr(3e-3);
  spec.mutable_task()->set_plugin("cross_entropy");
  auto* data = spec.mutable_data();
  auto* syn = data->mutable_train()->mutable_synthetic();
  syn->set_kind("gaussian_blobs");
  syn->set_num_samples(200);
  syn->set_num_features(8);
  syn->set_num_outputs(4);
  syn->set_noise(1.0);
  data->set_eval_fraction(0.2);
  data->set_batch_size(16);
  data->set_shuffle(true);
  data->set_eval_every(3);
  return spec;
}

ControllerMessage Assign(const std::string& job_id, const JobSpec& spec,
                         int stage = 0,
                         const std::vector<std::string>& peers = {}) {
  ControllerMessage m;
  auto* a = m.mutable_assign();
  a->set_job_id(job_id);
  a->set_stage(stage);
  *a->mutable_spec() = spec;
  for (const auto& p : peers) a->add_peer_addresses(p);
  return m;
}

// Stage s on `devices[s]`, all on one host.
void SetPlacements(ControllerMessage* m,
                   const std::vector<std::string>& devices) {
  for (const std::string& d : devices) {
    auto* p = m->mutable_assign()->add_placements();
    p->set_host("host-a");
    p->set_device(d);
  }
}

ControllerMessage Cancel(const std::string& job_id, const std::string& reason) {
  ControllerMessage m;
  m.mutable_cancel()->set_job_id(job_id);
  m.mutable_cancel()->set_reason(reason);
  return m;
}

// A one-stage job needs no transport; multi-stage tests set their own.
WorkerOptions TestOptions(const std::string& controller) {
  WorkerOptions options;
  options.controller = controller;
  options.plugin_dir = PluginDir();
  options.data_dir = TempDir();
  options.threads = 1;
  options.name = "test-worker";
  options.health_listen = "";
  options.min_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  options.stage_timeout = absl::Seconds(20);
  options.peer_address = "127.0.0.1:1";
  options.connect_transport = [](const std::string&, int,
                                 const std::vector<std::string>&,
                                 const std::string&, const std::atomic<bool>*)
      -> absl::StatusOr<std::unique_ptr<Transport>> {
    return absl::UnimplementedError("no transport in this test");
  };
  return options;
}

std::vector<double> LocalLosses(const JobSpec& spec) {
  PlanOptions plan_options;
  plan_options.base_dir = TempDir();
  absl::StatusOr<JobPlan> plan = PlanJob(spec, plan_options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  std::vector<double> losses;
  if (!plan.ok()) return losses;
  LocalJobOptions options;
  options.plugin_dir = PluginDir();
  options.threads = 1;
  options.on_step = [&](const StepReport& r, double) {
    losses.push_back(r.loss);
  };
  absl::Status status = RunLocalJob(*plan, options);
  EXPECT_TRUE(status.ok()) << status;
  return losses;
}

class WorkerDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    controller_ = std::make_unique<FakeController>("127.0.0.1:0");
    ASSERT_TRUE(controller_->ok());
  }

  std::unique_ptr<Worker> StartWorker(WorkerOptions options) {
    absl::StatusOr<std::unique_ptr<Worker>> worker =
        Worker::Start(std::move(options));
    EXPECT_TRUE(worker.ok()) << worker.status();
    return worker.ok() ? std::move(*worker) : nullptr;
  }

  std::unique_ptr<FakeController> controller_;
};

TEST_F(WorkerDaemonTest, RegistersWithCapabilitiesAndHeartbeats) {
  WorkerOptions options = TestOptions(controller_->address());
  options.memory_bytes = 123456789;
  auto worker = StartWorker(options);
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  ASSERT_EQ(id, "w1");
  const auto reg = controller_->registered().at(0);
  EXPECT_EQ(reg.name(), "test-worker");
  EXPECT_EQ(reg.capabilities().device(), "cpu");
  EXPECT_EQ(reg.capabilities().memory_bytes(), 123456789u);
  EXPECT_EQ(reg.capabilities().peer_address(), "127.0.0.1:1");
  EXPECT_EQ(reg.capabilities().threads(), 1);
  EXPECT_FALSE(reg.capabilities().hostname().empty());
  absl::SleepFor(absl::Milliseconds(10 * kHeartbeatMs));
  // ~10 expected; generous bounds for a loaded machine.
  EXPECT_GE(controller_->Heartbeats(id), 4);
  EXPECT_EQ(worker->worker_id(), "w1");
  EXPECT_EQ(worker->registrations(), 1);
}

TEST_F(WorkerDaemonTest, RunsOneStageJobMatchingTheLocalRunner) {
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  ASSERT_FALSE(id.empty());
  const JobSpec spec = SmallSpec(7);
  ASSERT_TRUE(controller_->Send(id, Assign("job-1", spec)));
  auto done = controller_->WaitForDone("job-1");
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->ok()) << done->error();
  EXPECT_FALSE(done->cancelled());
  EXPECT_EQ(done->stage(), 0);

  std::vector<double> losses;
  std::vector<int64_t> eval_steps;
  bool done_seen = false;
  for (const Heard& h : controller_->heard()) {
    if (h.message.has_step()) {
      EXPECT_FALSE(done_seen) << "step report after StageDone";
      const auto& r = h.message.step();
      EXPECT_EQ(r.job_id(), "job-1");
      EXPECT_EQ(r.stage(), 0);
      EXPECT_EQ(r.step().step(), static_cast<int64_t>(losses.size()) + 1);
      EXPECT_TRUE(std::isfinite(r.step().loss()));
      EXPECT_GT(r.step().lr(), 0);
      EXPECT_TRUE(r.step().metrics().count("accuracy")) << r.DebugString();
      ASSERT_EQ(r.step().stages_size(), 1);
      EXPECT_EQ(r.step().stages(0).stage(), 0);
      EXPECT_GT(r.step().stages(0).forward_s(), 0);
      losses.push_back(r.step().loss());
    } else if (h.message.has_eval()) {
      EXPECT_EQ(h.message.eval().job_id(), "job-1");
      EXPECT_TRUE(std::isfinite(h.message.eval().eval().loss()));
      EXPECT_EQ(h.message.eval().eval().samples(), 40);  // 20% of 200
      eval_steps.push_back(h.message.eval().eval().step());
    } else if (h.message.has_done()) {
      done_seen = true;
    }
  }
  EXPECT_THAT(eval_steps, ::testing::ElementsAre(3, 6, 7));
  // The same job in one process: bitwise the same losses.
  EXPECT_EQ(losses, LocalLosses(spec));
  EXPECT_FALSE(worker->busy());
}

// The controller assigns the spec as its own PlanJob normalized it; the
// worker plans it again against its data_dir.
TEST_F(WorkerDaemonTest, AcceptsAnAlreadyNormalizedSpec) {
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  PlanOptions plan_options;
  plan_options.base_dir = TempDir();
  absl::StatusOr<JobPlan> plan = PlanJob(SmallSpec(2), plan_options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(controller_->Send(id, Assign("normalized", plan->spec)));
  auto done = controller_->WaitForDone("normalized");
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->ok()) << done->error();
}

TEST_F(WorkerDaemonTest, BadSpecIsReportedAndWorkerStaysUsable) {
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  ASSERT_FALSE(id.empty());
  JobSpec bad = SmallSpec(3);
  bad.mutable_model()->mutable_blocks(0)->set_ffn_hidden_size(-4);
  ASSERT_TRUE(controller_->Send(id, Assign("bad", bad)));
  auto done = controller_->WaitForDone("bad");
  ASSERT_TRUE(done.has_value());
  EXPECT_FALSE(done->ok());
  EXPECT_FALSE(done->cancelled());
  EXPECT_THAT(done->error(), HasSubstr("model.blocks[0].ffn_hidden_size"));
  EXPECT_THAT(done->error(), HasSubstr("bad"));  // the job id

  const int beats = controller_->Heartbeats(id);
  absl::SleepFor(absl::Milliseconds(5 * kHeartbeatMs));
  EXPECT_GT(controller_->Heartbeats(id), beats);

  ASSERT_TRUE(controller_->Send(id, Assign("good", SmallSpec(2))));
  auto good = controller_->WaitForDone("good");
  ASSERT_TRUE(good.has_value());
  EXPECT_TRUE(good->ok()) << good->error();
  EXPECT_EQ(worker->registrations(), 1);
}

TEST_F(WorkerDaemonTest, UnknownPluginIsNamed) {
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  JobSpec spec = SmallSpec(2);
  spec.mutable_task()->set_plugin("no_such_task");
  ASSERT_TRUE(controller_->Send(id, Assign("j", spec)));
  auto done = controller_->WaitForDone("j");
  ASSERT_TRUE(done.has_value());
  EXPECT_FALSE(done->ok());
  EXPECT_THAT(done->error(), HasSubstr("no_such_task"));
}

TEST_F(WorkerDaemonTest, MissingDataFileIsNamedAndRelativeToDataDir) {
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  JobSpec spec = SmallSpec(2);
  auto* npy = spec.mutable_data()->mutable_train()->mutable_npy();
  npy->set_features("missing_features.npy");
  npy->set_targets("missing_targets.npy");
  ASSERT_TRUE(controller_->Send(id, Assign("j", spec)));
  auto done = controller_->WaitForDone("j");
  ASSERT_TRUE(done.has_value());
  EXPECT_FALSE(done->ok());
  EXPECT_THAT(done->error(), HasSubstr(TempDir() + "/missing_features.npy"));
}

TEST_F(WorkerDaemonTest, MultiStageJobWithoutPeersFailsCleanly) {
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_stages(2);
  ASSERT_TRUE(controller_->Send(id, Assign("one-peer", spec, 0, {"x:1"})));
  auto done = controller_->WaitForDone("one-peer");
  ASSERT_TRUE(done.has_value());
  EXPECT_THAT(done->error(), HasSubstr("peer_addresses"));
  ASSERT_TRUE(
      controller_->Send(id, Assign("no-transport", spec, 1, {"x:1", "y:2"})));
  done = controller_->WaitForDone("no-transport");
  ASSERT_TRUE(done.has_value());
  EXPECT_THAT(done->error(), HasSubstr("connecting to the other stages"));
  EXPECT_THAT(done->error(), HasSubstr("no transport in this test"));
}

TEST_F(WorkerDaemonTest, CancelStopsTheStageQuicklyAndBusyWorkerRefuses) {
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  ASSERT_TRUE(controller_->Send(id, Assign("long", SmallSpec(1000000))));
  ASSERT_TRUE(controller_->WaitForSteps("long", 2));
  EXPECT_TRUE(worker->busy());

  ASSERT_TRUE(controller_->Send(id, Assign("second", SmallSpec(2))));
  auto busy = controller_->WaitForDone("second");
  ASSERT_TRUE(busy.has_value());
  EXPECT_FALSE(busy->ok());
  EXPECT_THAT(busy->error(), HasSubstr("busy with job long"));

  const absl::Time start = absl::Now();
  ASSERT_TRUE(controller_->Send(id, Cancel("long", "user pressed stop")));
  auto done = controller_->WaitForDone("long", absl::Seconds(2));
  ASSERT_TRUE(done.has_value()) << "no StageDone within 2 s of the cancel";
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_FALSE(done->ok());
  EXPECT_TRUE(done->cancelled());
  EXPECT_EQ(done->error(), "user pressed stop");
  EXPECT_FALSE(worker->busy());

  ASSERT_TRUE(controller_->Send(id, Assign("after", SmallSpec(2))));
  auto after = controller_->WaitForDone("after");
  ASSERT_TRUE(after.has_value());
  EXPECT_TRUE(after->ok()) << after->error();
}

// A stage whose peers never connect waits in ConnectTcpTransport; a cancel
// must reach it there (not after peer_connect_timeout), and the worker must
// take the next job.
TEST_F(WorkerDaemonTest, CancelReachesAStageStillWaitingForItsPeers) {
  WorkerOptions options = TestOptions(controller_->address());
  options.connect_transport = nullptr;  // TCP over a PeerListener
  options.peer_address = "";
  options.listen = "127.0.0.1:0";
  options.peer_connect_timeout = absl::Seconds(30);
  auto worker = StartWorker(options);
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  ASSERT_FALSE(id.empty());
  // A port nobody listens on, for the peer that never shows up.
  std::string absent;
  {
    WorkerOptions o = options;
    o.controller = "127.0.0.1:1";
    auto other = StartWorker(o);
    ASSERT_NE(other, nullptr);
    absent = other->peer_address();
  }
  JobSpec spec = SmallSpec(5);
  spec.mutable_parallelism()->set_stages(2);
  const std::string me = worker->peer_address();
  // Stage 0 waits for stage 1 to dial in; stage 1 keeps dialing stage 0.
  const struct {
    const char* job;
    int stage;
    std::vector<std::string> peers;
  } cases[] = {{"waits-for-dial", 0, {me, absent}},
               {"keeps-dialing", 1, {absent, me}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.job);
    ASSERT_TRUE(controller_->Send(id, Assign(c.job, spec, c.stage, c.peers)));
    absl::SleepFor(absl::Milliseconds(300));  // well into the connect
    EXPECT_TRUE(worker->busy());
    const absl::Time start = absl::Now();
    ASSERT_TRUE(controller_->Send(id, Cancel(c.job, "user gave up")));
    auto done = controller_->WaitForDone(c.job, absl::Seconds(2));
    ASSERT_TRUE(done.has_value()) << "no StageDone within 2 s of the cancel";
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
    EXPECT_FALSE(done->ok());
    EXPECT_TRUE(done->cancelled());
    EXPECT_EQ(done->error(), "user gave up");
    EXPECT_FALSE(worker->busy());
  }
  ASSERT_TRUE(controller_->Send(id, Assign("next", SmallSpec(2))));
  auto next = controller_->WaitForDone("next");
  ASSERT_TRUE(next.has_value());
  EXPECT_TRUE(next->ok()) << next->error();
}

TEST_F(WorkerDaemonTest, KeepsTrainingWhileTheControllerIsAwayThenResendsAll) {
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  constexpr int kSteps = 4000;
  ASSERT_TRUE(controller_->Send(id, Assign("kept", SmallSpec(kSteps))));
  ASSERT_TRUE(controller_->WaitForSteps("kept", 1));
  const std::string address = controller_->address();
  controller_->Stop();
  absl::SleepFor(absl::Milliseconds(300));  // a few failed attempts

  controller_ = std::make_unique<FakeController>(address);
  if (!controller_->ok()) {
    GTEST_SKIP() << "could not rebind " << address;
  }
  ASSERT_EQ(controller_->WaitForRegistration(1), "w1");
  // The worker asks to keep its id and claims the stage it ran.
  const trainyard::v1::RegisterWorker reg = controller_->registered()[0];
  EXPECT_EQ(reg.worker_id(), id);
  EXPECT_EQ(reg.running().job_id(), "kept");
  EXPECT_EQ(reg.running().stage(), 0);
  EXPECT_EQ(reg.running().attempt(), 0);
  // The stage trained on while no controller listened, and every report
  // of the job is resent, in order: its start, each step once, its end.
  auto done = controller_->WaitForDone("kept");
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->ok()) << done->error();
  std::vector<int64_t> steps;
  bool started_first = false;
  for (const Heard& h : controller_->heard()) {
    if (h.message.has_started() && steps.empty()) started_first = true;
    if (h.message.has_step() && h.message.step().job_id() == "kept") {
      steps.push_back(h.message.step().step().step());
    }
  }
  EXPECT_TRUE(started_first);
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) ASSERT_EQ(steps[i], i + 1);
  for (int i = 0; i < 100 && worker->registrations() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(worker->registrations(), 2);
  ASSERT_TRUE(controller_->Send("w1", Assign("again", SmallSpec(2))));
  auto again = controller_->WaitForDone("again");
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(again->ok()) << again->error();
}

TEST_F(WorkerDaemonTest, CutOffPastTheAdoptTimeoutStopsTheStage) {
  controller_->set_adopt_timeout_ms(500);
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  ASSERT_TRUE(controller_->Send(id, Assign("orphan", SmallSpec(100000000))));
  ASSERT_TRUE(controller_->WaitForSteps("orphan", 1));
  const std::string address = controller_->address();
  controller_->Stop();
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(worker->busy());  // still training
  for (int i = 0; i < 200 && worker->busy(); ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE(worker->busy());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  // Its end, with the reason, reaches the next controller.
  controller_ = std::make_unique<FakeController>(address);
  if (!controller_->ok()) GTEST_SKIP() << "could not rebind " << address;
  auto done = controller_->WaitForDone("orphan");
  ASSERT_TRUE(done.has_value());
  EXPECT_FALSE(done->ok());
  EXPECT_THAT(done->error(), HasSubstr("cut off from the controller"));
  // A code the controller restarts the job for.
  EXPECT_EQ(done->code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(done->cancelled());
}

TEST_F(WorkerDaemonTest, SpecPathsMustStayInsideTheDataDir) {
  WorkerOptions options = TestOptions(controller_->address());
  options.data_dir = TempDir();
  auto worker = StartWorker(options);
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  JobSpec spec = SmallSpec(2);
  spec.mutable_checkpoint()->set_dir("../escaped-checkpoints");
  ASSERT_TRUE(controller_->Send(id, Assign("escape", spec)));
  auto done = controller_->WaitForDone("escape");
  ASSERT_TRUE(done.has_value());
  EXPECT_FALSE(done->ok());
  EXPECT_EQ(done->code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(done->error(),
              HasSubstr("checkpoint.dir: \"../escaped-checkpoints\" resolves"));
  EXPECT_THAT(done->error(), HasSubstr("outside the data folder"));
  // Nothing was created outside.
  struct stat st;
  EXPECT_NE(stat((options.data_dir + "/../escaped-checkpoints").c_str(), &st),
            0);
}

TEST_F(WorkerDaemonTest, RefusedClaimStopsTheStage) {
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  ASSERT_TRUE(controller_->Send(id, Assign("stale", SmallSpec(100000000))));
  ASSERT_TRUE(controller_->WaitForSteps("stale", 1));
  const std::string address = controller_->address();
  controller_->Stop();
  controller_ = std::make_unique<FakeController>(address);
  if (!controller_->ok()) {
    GTEST_SKIP() << "could not rebind " << address;
  }
  ASSERT_EQ(controller_->WaitForRegistration(1), "w1");
  EXPECT_EQ(controller_->registered()[0].running().job_id(), "stale");
  EXPECT_TRUE(worker->busy());
  // What a controller that does not accept the claim answers.
  ASSERT_TRUE(controller_->Send("w1", Cancel("stale", "not adopted")));
  auto done = controller_->WaitForDone("stale");
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->cancelled());
  EXPECT_EQ(done->error(), "not adopted");
  for (int i = 0; i < 100 && worker->busy(); ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE(worker->busy());
}

TEST_F(WorkerDaemonTest, NoRegistrationReplyTimesOutAndRetries) {
  // A server that accepts the stream but never answers.
  class Silent final : public trainyard::v1::WorkerService::Service {
   public:
    grpc::Status Connect(
        grpc::ServerContext* context,
        grpc::ServerReaderWriter<ControllerMessage, WorkerMessage>* stream)
        override {
      connects.fetch_add(1);
      WorkerMessage m;
      while (stream->Read(&m)) {
      }
      return grpc::Status::OK;
    }
    std::atomic<int> connects{0};
  } silent;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&silent);
  auto server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  WorkerOptions options = TestOptions(absl::StrCat("127.0.0.1:", port));
  options.register_timeout = absl::Milliseconds(200);
  auto worker = StartWorker(options);
  ASSERT_NE(worker, nullptr);
  for (int i = 0; i < 100 && silent.connects.load() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(silent.connects.load(), 2);
  EXPECT_EQ(worker->registrations(), 0);
  worker->Shutdown();
  server->Shutdown(std::chrono::system_clock::now());
}

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

TEST(WorkerTest, CudaWorkerWithoutAUsableGpuDoesNotStart) {
  if (ExecContext::Create(Device::Cuda(0), Precision::kFp32).ok()) {
    GTEST_SKIP() << "cuda:0 is usable here; this test needs a machine "
                    "without a GPU";
  }
  WorkerOptions options = TestOptions("127.0.0.1:1");
  options.device = "cuda:0";
  absl::StatusOr<std::unique_ptr<Worker>> w = Worker::Start(options);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(w.status().message(),
              HasSubstr("--device cuda:0: cuda:0 is not usable: "));
}

TEST(WorkerOptionsTest, RejectsBadDeviceAndMissingFlags) {
  WorkerOptions options = TestOptions("127.0.0.1:1");
  options.device = "cuda:0";
  absl::StatusOr<WorkerOptions> valid = ValidateWorkerOptions(options);
  ASSERT_TRUE(valid.ok()) << valid.status();
  EXPECT_EQ(valid->device, "cuda:0");

  options.device = "tpu";
  EXPECT_THAT(ValidateWorkerOptions(options).status().message(),
              HasSubstr("--device: device \"tpu\": expected \"cpu\" or "
                        "\"cuda:N\""));
  options.device = "cuda";
  EXPECT_THAT(ValidateWorkerOptions(options).status().message(),
              HasSubstr("name the GPU, e.g. \"cuda:0\""));

  options = TestOptions("");
  EXPECT_THAT(ValidateWorkerOptions(options).status().message(),
              HasSubstr("--controller"));
  options = TestOptions("127.0.0.1:1");
  options.plugin_dir = TempDir() + "/nope";
  EXPECT_THAT(ValidateWorkerOptions(options).status().message(),
              HasSubstr("--plugin_dir " + TempDir() + "/nope"));

  options = TestOptions("127.0.0.1:1");
  options.name = "";
  options.memory_bytes = 0;
  valid = ValidateWorkerOptions(options);
  ASSERT_TRUE(valid.ok()) << valid.status();
  EXPECT_THAT(valid->name, HasSubstr(absl::StrCat("-", getpid())));
  EXPECT_GT(valid->memory_bytes, 0u);
}

// grpc.health.v1.Health/Check by hand (no generated health stubs in
// Debian's gRPC): HealthCheckRequest{service} and the response's bytes;
// SERVING is field 1 = 1 ("\x08\x01"), NOT_SERVING field 1 = 2.
std::string HealthCheck(int port, const std::string& service) {
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  std::string req;
  if (!service.empty()) {
    req = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  }
  grpc::Slice slice(req);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  absl::Notification finished;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) {
                   status = s;
                   finished.Notify();
                 });
  finished.WaitForNotification();
  if (!status.ok()) return "error: " + status.error_message();
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return "error: dump";
  std::string bytes;
  for (const auto& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes;
}

const std::string kServing("\x08\x01", 2);
const std::string kNotServing("\x08\x02", 2);

TEST(WorkerHealthTest, ServesHealthCheck) {
  WorkerOptions options = TestOptions("127.0.0.1:1");  // nobody there
  options.health_listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Start(options);
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_GT((*worker)->health_port(), 0);
  // Alive (liveness) but not registered (readiness).
  EXPECT_EQ(HealthCheck((*worker)->health_port(), ""), kServing);
  EXPECT_EQ(
      HealthCheck((*worker)->health_port(), "trainyard.v1.WorkerRegistration"),
      kNotServing);
}

TEST_F(WorkerDaemonTest, ReadinessFollowsRegistration) {
  WorkerOptions options = TestOptions(controller_->address());
  options.health_listen = "127.0.0.1:0";
  auto worker = StartWorker(options);
  ASSERT_NE(worker, nullptr);
  controller_->WaitForRegistration(1);
  std::string status;
  for (int i = 0; i < 100 && status != kServing; ++i) {
    status =
        HealthCheck(worker->health_port(), "trainyard.v1.WorkerRegistration");
    if (status != kServing) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(status, kServing);
}

std::string Bytes(grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes;
}

// ServerReflectionInfo with list_services (field 7, empty string) lists the
// health service and reflection itself.
TEST(WorkerHealthTest, ServesReflection) {
  WorkerOptions options = TestOptions("127.0.0.1:1");
  options.health_listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Start(options);
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*worker)->health_port()),
                          grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(
      &context,
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](intptr_t want) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(tag), want);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(step(1));
  grpc::Slice request_slice(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&request_slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(step(2));
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(3));
  ASSERT_TRUE(step(3));
  const std::string bytes = Bytes(response);
  EXPECT_THAT(bytes, HasSubstr("grpc.health.v1.Health"));
  EXPECT_THAT(bytes, HasSubstr("grpc.reflection.v1alpha.ServerReflection"));
  call->WritesDone(reinterpret_cast<void*>(4));
  step(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// ---- Transport choice.

v1::StageAssignment AssignmentOn(const std::vector<StagePlacement>& stages) {
  v1::StageAssignment a;
  for (const StagePlacement& p : stages) {
    auto* out = a.add_placements();
    out->set_host(p.host);
    out->set_device(p.device);
  }
  return a;
}

TEST(ChooseAssignmentTransportTest, CpuStagesUseTcp) {
  auto choice = ChooseAssignmentTransport(
      AssignmentOn({{"a", "cpu"}, {"b", "cpu"}}), 2, /*nccl_built=*/true);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->kind, TransportKind::kTcp);
  EXPECT_EQ(choice->reason, "every stage is on cpu: using TCP");
}

TEST(ChooseAssignmentTransportTest, DistinctGpusOfOneHostUseNcclWhenBuilt) {
  const v1::StageAssignment a =
      AssignmentOn({{"a", "cuda:0"}, {"a", "cuda:1"}});
  auto nccl = ChooseAssignmentTransport(a, 2, /*nccl_built=*/true);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  EXPECT_EQ(nccl->kind, TransportKind::kNccl);
  EXPECT_EQ(nccl->reason, "all 2 stages are on distinct GPUs: using NCCL");
  auto tcp = ChooseAssignmentTransport(a, 2, /*nccl_built=*/false);
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_EQ(tcp->kind, TransportKind::kTcp);
  EXPECT_THAT(tcp->reason, HasSubstr("this build has no NCCL"));
  // This build: NCCL exactly when the CUDA toolkit was there.
  auto here = ChooseAssignmentTransport(a, 2, NcclTransportBuilt());
  ASSERT_TRUE(here.ok());
  EXPECT_EQ(here->kind,
            NcclTransportBuilt() ? TransportKind::kNccl : TransportKind::kTcp);
}

TEST(ChooseAssignmentTransportTest, SharedGpuUsesTcp) {
  auto choice = ChooseAssignmentTransport(
      AssignmentOn({{"a", "cuda:0"}, {"a", "cuda:0"}}), 2, true);
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->kind, TransportKind::kTcp);
  EXPECT_EQ(choice->reason,
            "stages 0 and 1 share cuda:0 on host a: using TCP with host "
            "staging");
}

TEST(ChooseAssignmentTransportTest, NoPlacementsFromAnOlderControllerIsTcp) {
  auto choice = ChooseAssignmentTransport(v1::StageAssignment(), 2, true);
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->kind, TransportKind::kTcp);
  EXPECT_THAT(choice->reason, HasSubstr("names no stage placements"));
}

TEST(ChooseAssignmentTransportTest, BadPlacementsAreNamed) {
  auto count = ChooseAssignmentTransport(AssignmentOn({{"a", "cpu"}}), 2, true);
  EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(count.status().message(),
            "StageAssignment.placements: the job has 2 stages, got 1 "
            "placements");
  auto device = ChooseAssignmentTransport(
      AssignmentOn({{"a", "cpu"}, {"a", "cuda"}}), 2, true);
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(device.status().message(),
              HasSubstr("StageAssignment.placements: transport choice: "
                        "stage 1"));
}

bool CudaDeviceUsable() {
  return ExecContext::Create(Device::Cuda(0), Precision::kFp32).ok();
}

// A worker registered as cuda:`index` even without a usable GPU here.
WorkerOptions GpuOptions(const std::string& controller, int index) {
  WorkerOptions options = TestOptions(controller);
  options.name = absl::StrCat("gpu", index);
  options.device = absl::StrCat("cuda:", index);
  options.check_device = false;
  return options;
}

// The StageTransport reports the fake controller heard for `job_id`.
std::vector<v1::StageTransport> TransportReports(FakeController& controller,
                                                 const std::string& job_id) {
  std::vector<v1::StageTransport> out;
  for (const Heard& h : controller.heard()) {
    if (h.message.has_transport() && h.message.transport().job_id() == job_id) {
      out.push_back(h.message.transport());
    }
  }
  return out;
}

TEST_F(WorkerDaemonTest, CpuPlacementsUseTheTcpPathAndReportTheChoice) {
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_stages(2);
  ControllerMessage m = Assign("cpu-pair", spec, 0, {"x:1", "y:2"});
  SetPlacements(&m, {"cpu", "cpu"});
  ASSERT_TRUE(controller_->Send(id, m));
  auto done = controller_->WaitForDone("cpu-pair");
  ASSERT_TRUE(done.has_value());
  // The injected TCP seam was used.
  EXPECT_THAT(done->error(), HasSubstr("no transport in this test"));
  auto reports = TransportReports(*controller_, "cpu-pair");
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].stage(), 0);
  EXPECT_EQ(reports[0].kind(), "tcp");
  EXPECT_EQ(reports[0].reason(), "every stage is on cpu: using TCP");
}

TEST_F(WorkerDaemonTest, PlacementThatIsNotThisWorkersDeviceIsRefused) {
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_stages(2);
  ControllerMessage m = Assign("elsewhere", spec, 0, {"x:1", "y:2"});
  SetPlacements(&m, {"cuda:0", "cuda:1"});
  ASSERT_TRUE(controller_->Send(id, m));
  auto done = controller_->WaitForDone("elsewhere");
  ASSERT_TRUE(done.has_value());
  EXPECT_FALSE(done->ok());
  EXPECT_THAT(done->error(),
              HasSubstr("StageAssignment.placements[0].device: \"cuda:0\", "
                        "but this worker runs on cpu"));
}

// On this machine (CUDA toolkit, no GPU) two stages on cuda:0 and cuda:1
// choose NCCL, and the real CreateNcclTransport fails at once, naming NCCL
// and the device: the stage reports it instead of waiting for its peer.
TEST_F(WorkerDaemonTest, NcclWithoutADeviceFailsTheStageClearly) {
  if (CudaDeviceUsable()) {
    GTEST_SKIP() << "cuda:0 is usable here; this test needs a machine "
                    "without a GPU";
  }
  auto worker = StartWorker(GpuOptions(controller_->address(), 1));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  EXPECT_EQ(controller_->registered().at(0).capabilities().device(), "cuda:1");
  JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_stages(2);
  spec.set_device("cuda");
  ControllerMessage m = Assign("nccl", spec, 1, {"x:1", "y:2"});
  SetPlacements(&m, {"cuda:0", "cuda:1"});
  const absl::Time start = absl::Now();
  ASSERT_TRUE(controller_->Send(id, m));
  auto done = controller_->WaitForDone("nccl", absl::Seconds(10));
  ASSERT_TRUE(done.has_value()) << "no StageDone within 10 s";
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_FALSE(done->ok());
  EXPECT_FALSE(done->cancelled());
  auto reports = TransportReports(*controller_, "nccl");
  ASSERT_EQ(reports.size(), 1u);
  if (NcclTransportBuilt()) {
    EXPECT_EQ(reports[0].kind(), "nccl");
    EXPECT_EQ(reports[0].reason(),
              "all 2 stages are on distinct GPUs: using NCCL");
    EXPECT_THAT(done->error(),
                HasSubstr("creating the NCCL transport to the other stages: "
                          "nccl transport (job \"nccl\", rank 1, cuda:1): "
                          "no CUDA device"));
  } else {
    EXPECT_EQ(reports[0].kind(), "tcp");
    EXPECT_THAT(reports[0].reason(), HasSubstr("this build has no NCCL"));
    EXPECT_THAT(done->error(), HasSubstr("no transport in this test"));
  }
  EXPECT_FALSE(worker->busy());
}

// A fake NCCL transport factory: does what CreateNcclTransport does with
// the rendezvous (rank 0 puts the ids, the others get them; nobody returns
// before every rank has joined, as NCCL's communicator init), or waits for
// a key nobody puts; records what it was given.
class FakeNccl {
 public:
  enum class Mode { kExchange, kWaitForever };
  struct Call {
    std::string job_id;
    int rank = -1;
    int world_size = 0;
    int device = -1;
    absl::Duration init_timeout;
    absl::StatusOr<std::string> ids;  // what it put or got
  };

  explicit FakeNccl(Mode mode) : mode_(mode) {}

  NcclTransportFactory Factory() {
    return [this](const NcclTransportOptions& o)
               -> absl::StatusOr<std::unique_ptr<Transport>> {
      absl::StatusOr<std::string> ids;
      const std::string key = o.job_id + "/nccl_id";
      {
        absl::MutexLock lock(&mu_);
        ++waiting_;
      }
      if (mode_ == Mode::kWaitForever) {
        ids = o.rendezvous->Get(o.job_id + "/never_put", absl::Minutes(5));
      } else if (o.rank == 0) {
        const std::string bytes(384, '\x5a');
        absl::Status st = o.rendezvous->Put(key, bytes);
        ids = st.ok() ? absl::StatusOr<std::string>(bytes)
                      : absl::StatusOr<std::string>(st);
      } else {
        ids = o.rendezvous->Get(key, o.init_timeout);
      }
      absl::MutexLock lock(&mu_);
      calls_.push_back(
          {o.job_id, o.rank, o.world_size, o.device, o.init_timeout, ids});
      if (!ids.ok()) return ids.status();
      auto all_joined = [this, n = o.world_size]()
                            ABSL_SHARED_LOCKS_REQUIRED(mu_) {
                              return static_cast<int>(calls_.size()) >= n;
                            };
      mu_.AwaitWithTimeout(absl::Condition(&all_joined), o.init_timeout);
      return std::unique_ptr<Transport>(
          new Fake(o.rank, o.world_size, &aborts_));
    };
  }

  // Waits until `n` ranks are inside the factory.
  bool WaitForWaiting(int n, absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]()
                      ABSL_SHARED_LOCKS_REQUIRED(mu_) { return waiting_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  // Waits until `n` ranks have returned from their rendezvous call.
  std::vector<Call> WaitForCalls(int n,
                                 absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(calls_.size()) >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return calls_;
  }
  int aborts() const { return aborts_.load(); }

 private:
  // The transport it returns; only Abort matters here (the stage cannot
  // start without a GPU).
  class Fake final : public Transport {
   public:
    Fake(int rank, int world_size, std::atomic<int>* aborts)
        : rank_(rank), world_size_(world_size), aborts_(aborts) {}
    int rank() const override { return rank_; }
    int world_size() const override { return world_size_; }
    absl::Status Send(int, Message) override { return Unusable(); }
    absl::StatusOr<Message> Recv(int, absl::Duration) override {
      return Unusable();
    }
    absl::Status AllReduceSum(std::vector<double>*, absl::Duration) override {
      return Unusable();
    }
    void Abort(const absl::Status&) override { aborts_->fetch_add(1); }

   private:
    static absl::Status Unusable() {
      return absl::UnavailableError("fake NCCL transport");
    }
    const int rank_;
    const int world_size_;
    std::atomic<int>* const aborts_;
  };

  const Mode mode_;
  std::atomic<int> aborts_{0};
  absl::Mutex mu_;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
};

// The controller's stream drops while a rank waits for the NCCL ids: the
// wait ends at once with Unavailable naming the controller.
TEST_F(WorkerDaemonTest, StreamDropFailsAWaitingRendezvousNamingController) {
  if (!NcclTransportBuilt()) GTEST_SKIP() << "this build has no NCCL";
  FakeNccl nccl(FakeNccl::Mode::kWaitForever);
  WorkerOptions options = GpuOptions(controller_->address(), 1);
  options.create_nccl_transport = nccl.Factory();
  auto worker = StartWorker(options);
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_stages(2);
  spec.set_device("cuda");
  ControllerMessage m = Assign("orphan", spec, 1, {"x:1", "y:2"});
  SetPlacements(&m, {"cuda:0", "cuda:1"});
  ASSERT_TRUE(controller_->Send(id, m));
  ASSERT_TRUE(nccl.WaitForWaiting(1));
  // The fake controller heard the Get (and never answers it).
  bool heard_get = false;
  for (int i = 0; i < 200 && !heard_get; ++i) {
    for (const Heard& h : controller_->heard()) {
      heard_get =
          heard_get || (h.message.has_rendezvous_get() &&
                        h.message.rendezvous_get().key() == "orphan/never_put");
    }
    if (!heard_get) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(heard_get);
  const std::string address = controller_->address();
  const absl::Time start = absl::Now();
  controller_->Stop();
  std::vector<FakeNccl::Call> calls = nccl.WaitForCalls(1);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(calls[0].ids.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(calls[0].ids.status().message(),
              HasSubstr("lost its connection to the controller at " + address));
}

// Against the real controller: the stages of a job on cuda:0 and cuda:1
// choose NCCL, exchange the ids through the controller's rendezvous, and
// the job's history says why NCCL.
class RealControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = TempDir() + "/controller_XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    ControllerOptions options;
    options.data_dir = dir;
    auto server = ControllerServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    jobs_ = v1::JobService::NewStub(grpc::CreateChannel(
        server_->address(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    workers_.clear();
    server_.reset();
  }

  // Starts workers on cuda:0 .. cuda:n-1 (in that registration order, so
  // stage s runs on cuda:s) with `factory` for NCCL.
  void StartGpuWorkers(int n, const NcclTransportFactory& factory) {
    for (int i = 0; i < n; ++i) {
      WorkerOptions options = GpuOptions(server_->address(), i);
      options.create_nccl_transport = factory;
      auto worker = Worker::Start(options);
      ASSERT_TRUE(worker.ok()) << worker.status();
      workers_.push_back(std::move(*worker));
      for (int t = 0; t < 500 && workers_.back()->registrations() == 0; ++t) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      ASSERT_EQ(workers_.back()->registrations(), 1);
    }
  }

  std::string Submit(const JobSpec& spec) {
    v1::SubmitJobRequest req;
    req.set_request_id("r1");
    *req.mutable_spec() = spec;
    grpc::ClientContext ctx;
    v1::Job job;
    grpc::Status st = jobs_->SubmitJob(&ctx, req, &job);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return job.job_id();
  }
  v1::Job WaitTerminal(const std::string& job_id,
                       absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time deadline = absl::Now() + timeout;
    v1::Job job;
    while (absl::Now() < deadline) {
      grpc::ClientContext ctx;
      v1::GetJobRequest req;
      req.set_job_id(job_id);
      EXPECT_TRUE(jobs_->GetJob(&ctx, req, &job).ok());
      if (job.state() == v1::SUCCEEDED || job.state() == v1::FAILED ||
          job.state() == v1::CANCELLED) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return job;
  }
  // The job's whole history (it has ended).
  std::vector<v1::JobEvent> History(const std::string& job_id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    auto reader = jobs_->WatchJob(&ctx, req);
    std::vector<v1::JobEvent> events;
    v1::JobEvent e;
    while (reader->Read(&e)) events.push_back(e);
    EXPECT_TRUE(reader->Finish().ok());
    return events;
  }

  JobSpec GpuSpec() {
    JobSpec spec = SmallSpec(5);
    spec.mutable_parallelism()->set_stages(2);
    spec.set_device("cuda");
    return spec;
  }

  std::unique_ptr<ControllerServer> server_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

TEST_F(RealControllerTest, NcclRanksExchangeTheIdsThroughTheController) {
  if (!NcclTransportBuilt()) GTEST_SKIP() << "this build has no NCCL";
  if (CudaDeviceUsable()) {
    GTEST_SKIP() << "cuda:0 is usable here: the stages would run on the "
                    "fake transport";
  }
  FakeNccl nccl(FakeNccl::Mode::kExchange);
  StartGpuWorkers(2, nccl.Factory());
  const std::string job_id = Submit(GpuSpec());
  std::vector<FakeNccl::Call> calls = nccl.WaitForCalls(2);
  ASSERT_EQ(calls.size(), 2u);
  std::map<int, FakeNccl::Call> by_rank;
  for (const auto& c : calls) by_rank[c.rank] = c;
  ASSERT_EQ(by_rank.size(), 2u);
  for (int rank : {0, 1}) {
    const FakeNccl::Call& c = by_rank[rank];
    SCOPED_TRACE(rank);
    EXPECT_EQ(c.job_id, job_id);
    EXPECT_EQ(c.world_size, 2);
    EXPECT_EQ(c.device, rank);  // cuda:<rank>
    // min(stage_timeout 20 s, peer_connect_timeout 30 s)
    EXPECT_EQ(c.init_timeout, absl::Seconds(20));
    ASSERT_TRUE(c.ids.ok()) << c.ids.status();
    EXPECT_EQ(*c.ids, std::string(384, '\x5a'));
  }
  // Without a GPU each stage then fails to start on its device; the
  // transports it had made are aborted.
  v1::Job job = WaitTerminal(job_id);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("is not usable"));
  for (int i = 0; i < 200 && nccl.aborts() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(nccl.aborts(), 2);
  std::vector<std::string> notes;
  for (const v1::JobEvent& e : History(job_id)) {
    if (e.has_note()) notes.push_back(e.note().text());
  }
  EXPECT_EQ(notes, std::vector<std::string>{
                       "transport: all 2 stages are on distinct GPUs: using "
                       "NCCL"});
}

// A cancel reaches ranks that wait for the NCCL ids: the wait ends at once
// and the workers are free, not after the rendezvous timeout.
TEST_F(RealControllerTest, CancelReachesRanksWaitingInTheRendezvous) {
  if (!NcclTransportBuilt()) GTEST_SKIP() << "this build has no NCCL";
  FakeNccl nccl(FakeNccl::Mode::kWaitForever);
  StartGpuWorkers(2, nccl.Factory());
  const std::string job_id = Submit(GpuSpec());
  ASSERT_TRUE(nccl.WaitForWaiting(2));
  absl::SleepFor(absl::Milliseconds(100));  // the Gets reach the controller
  const absl::Time start = absl::Now();
  {
    grpc::ClientContext ctx;
    v1::CancelJobRequest req;
    req.set_job_id(job_id);
    req.set_reason("operator");
    v1::Job job;
    ASSERT_TRUE(jobs_->CancelJob(&ctx, req, &job).ok());
  }
  std::vector<FakeNccl::Call> calls = nccl.WaitForCalls(2, absl::Seconds(5));
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  for (const auto& c : calls) {
    SCOPED_TRACE(c.rank);
    // Whichever came first: the controller closing the job's rendezvous
    // (Aborted), the worker's own cancel (Cancelled), or, for a Get that
    // reached the controller only after the cancel, its refusal.
    EXPECT_THAT(c.ids.status().code(),
                ::testing::AnyOf(absl::StatusCode::kAborted,
                                 absl::StatusCode::kCancelled,
                                 absl::StatusCode::kFailedPrecondition));
    EXPECT_THAT(c.ids.status().message(), HasSubstr("operator"));
  }
  for (const auto& w : workers_) {
    for (int i = 0; i < 200 && w->busy(); ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_FALSE(w->busy());
  }
  EXPECT_EQ(WaitTerminal(job_id).state(), v1::CANCELLED);
}

}  // namespace
}  // namespace trainyard
