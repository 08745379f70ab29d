// What the worker daemon's tests share: a small job spec, the controller
// messages they send, worker options for tests, the same job run by
// `trainyard train`'s runner, and WorkerDaemonTest (a fake controller per
// test). Test-only.
#ifndef TRAINYARD_WORKER_WORKER_TEST_UTIL_H_
#define TRAINYARD_WORKER_WORKER_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "proto/trainyard.pb.h"
#include "worker/fake_controller.h"
#include "worker/worker_daemon.h"

namespace trainyard {
namespace testing {

// Two blocks on gaussian blobs, cross entropy, evals every 3 steps.
v1::JobSpec SmallSpec(int64_t steps);

// StageAssignment of `job_id`'s stage (gang rank) `stage`.
v1::ControllerMessage Assign(const std::string& job_id, const v1::JobSpec& spec,
                             int stage = 0,
                             const std::vector<std::string>& peers = {});

// Stage s on `devices[s]`, all on one host.
void SetPlacements(v1::ControllerMessage* m,
                   const std::vector<std::string>& devices);

v1::ControllerMessage Cancel(const std::string& job_id,
                             const std::string& reason);

// A one-stage job needs no transport; multi-stage tests set their own.
WorkerOptions TestOptions(const std::string& controller);

// A worker registered as cuda:`index` even without a usable GPU here.
WorkerOptions GpuOptions(const std::string& controller, int index);

bool CudaDeviceUsable();

// The losses of `spec` run in one process (engine/local_job.h).
std::vector<double> LocalLosses(const v1::JobSpec& spec);

// The StageTransport reports the fake controller heard for `job_id`.
std::vector<v1::StageTransport> TransportReports(FakeController& controller,
                                                 const std::string& job_id);

// A fake controller for each test, and workers that dial it.
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

}  // namespace testing
}  // namespace trainyard

#endif  // TRAINYARD_WORKER_WORKER_TEST_UTIL_H_
