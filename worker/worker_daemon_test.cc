// The worker daemon against a fake controller served in-process on
// 127.0.0.1: registration, heartbeats, step/eval/done reports, bad
// assignments, cancellation, reconnection and adoption, the options' check
// and the health service.
#include "worker/worker_daemon.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "engine/test_paths.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/exec_context.h"
#include "plan/job_plan.h"
#include "proto/trainyard.grpc.pb.h"
#include "proto/trainyard.pb.h"
#include "worker/fake_controller.h"
#include "worker/worker_test_util.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using ::trainyard::testing::Assign;
using ::trainyard::testing::Cancel;
using ::trainyard::testing::FakeController;
using ::trainyard::testing::Heard;
using ::trainyard::testing::kHeartbeatMs;
using ::trainyard::testing::LocalLosses;
using ::trainyard::testing::SmallSpec;
using ::trainyard::testing::TempDir;
using ::trainyard::testing::TestOptions;
using ::trainyard::testing::WorkerDaemonTest;
using ::trainyard::v1::ControllerMessage;
using ::trainyard::v1::JobSpec;
using ::trainyard::v1::WorkerMessage;

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

// Asked to stop (SIGTERM), the worker lets its stage finish the step, tells
// the controller why, then closes its writes: the controller reads the
// StageDone and then a clean end of the stream, even when it reads slowly
// and heartbeats fall due meanwhile.
TEST_F(WorkerDaemonTest, DrainReportsWhyThenClosesItsStreamCleanly) {
  controller_->set_pause_after_done(absl::Milliseconds(6 * kHeartbeatMs));
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  ASSERT_TRUE(controller_->Send(id, Assign("long", SmallSpec(1000000))));
  ASSERT_TRUE(controller_->WaitForSteps("long", 2));

  const absl::Time start = absl::Now();
  worker->Drain(absl::Seconds(10));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  auto done = controller_->WaitForDone("long", absl::ZeroDuration());
  ASSERT_TRUE(done.has_value()) << "no StageDone before the drain returned";
  EXPECT_FALSE(done->ok());
  EXPECT_FALSE(done->cancelled());
  EXPECT_THAT(done->error(), HasSubstr("is shutting down (asked to stop)"));
  EXPECT_EQ(controller_->stream_end(id),
            FakeController::StreamEnd::kWritesClosed);
  bool draining = false;
  for (const Heard& h : controller_->heard()) {
    if (h.message.has_done()) break;
    draining |= h.message.has_heartbeat() && h.message.heartbeat().draining();
  }
  EXPECT_TRUE(draining) << "no draining heartbeat before the StageDone";
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

}  // namespace
}  // namespace trainyard
