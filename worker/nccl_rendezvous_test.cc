// The NCCL transport's rendezvous through the controller, with a fake NCCL
// factory: a dropped stream fails a waiting rank at once (fake
// controller); against the real controller (in-process, real gRPC streams)
// the ranks exchange the ids, and a cancel reaches ranks still waiting.
#include <stdlib.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "controller/controller_service.h"
#include "engine/test_paths.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/trainyard.grpc.pb.h"
#include "proto/trainyard.pb.h"
#include "transport/nccl_transport.h"
#include "transport/transport.h"
#include "worker/fake_controller.h"
#include "worker/worker_daemon.h"
#include "worker/worker_test_util.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using ::trainyard::testing::Assign;
using ::trainyard::testing::CudaDeviceUsable;
using ::trainyard::testing::GpuOptions;
using ::trainyard::testing::Heard;
using ::trainyard::testing::SetPlacements;
using ::trainyard::testing::SmallSpec;
using ::trainyard::testing::TempDir;
using ::trainyard::testing::WorkerDaemonTest;
using ::trainyard::v1::ControllerMessage;
using ::trainyard::v1::JobSpec;

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
