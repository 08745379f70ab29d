// FakeController: a WorkerService served in-process on 127.0.0.1 for the
// worker daemon's tests. It registers every worker, records everything
// workers send, and sends what the test tells it to. Test-only.
//
// Thread safety: every method may be called from any thread.
#ifndef TRAINYARD_WORKER_FAKE_CONTROLLER_H_
#define TRAINYARD_WORKER_FAKE_CONTROLLER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/trainyard.grpc.pb.h"
#include "proto/trainyard.pb.h"

namespace trainyard {
namespace testing {

// The heartbeat interval the fake controller asks for.
constexpr int64_t kHeartbeatMs = 50;

// What the fake controller heard from one worker.
struct Heard {
  std::string worker_id;
  v1::WorkerMessage message;
};

class FakeController final : public v1::WorkerService::Service {
 public:
  using Stream =
      grpc::ServerReaderWriter<v1::ControllerMessage, v1::WorkerMessage>;

  // Serves on `address` ("127.0.0.1:0" for a free port).
  explicit FakeController(const std::string& address);
  ~FakeController() override { Stop(); }

  bool ok() const { return server_ != nullptr && port_ > 0; }
  // Sent in WorkerRegistered (0: workers never give up their stage).
  void set_adopt_timeout_ms(int64_t ms) { adopt_timeout_ms_ = ms; }
  // After reading a StageDone, waits this long before reading on (a
  // controller busy elsewhere): what the worker writes meanwhile queues up.
  void set_pause_after_done(absl::Duration pause) {
    absl::MutexLock lock(&mu_);
    pause_after_done_ = pause;
  }
  std::string address() const;

  // Ends every stream at once, like a controller that dies.
  void Stop();

  grpc::Status Connect(grpc::ServerContext*, Stream* stream) override;

  bool Send(const std::string& worker_id, const v1::ControllerMessage& message);

  // Waits for the n-th registration (1-based) and returns its worker id.
  std::string WaitForRegistration(int n,
                                  absl::Duration timeout = absl::Seconds(10));
  // Waits for StageDone of `job_id` and returns it (nullopt on timeout).
  std::optional<v1::StageDone> WaitForDone(
      const std::string& job_id, absl::Duration timeout = absl::Seconds(20));
  // Waits until `job_id` has reported `count` step reports.
  bool WaitForSteps(const std::string& job_id, int count,
                    absl::Duration timeout = absl::Seconds(20));

  int Heartbeats(const std::string& worker_id);
  // How the stream of `worker_id` ended: by the worker closing its writes,
  // or cancelled (either end, or a broken connection).
  enum class StreamEnd { kOpen, kWritesClosed, kCancelled };
  StreamEnd stream_end(const std::string& worker_id);
  std::vector<Heard> heard();
  // In registration order, matching worker_ids().
  std::vector<v1::RegisterWorker> registered();
  std::vector<std::string> worker_ids();

 private:
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex write_mu_;  // one writer per stream at a time
  absl::Mutex mu_;
  int connects_ ABSL_GUARDED_BY(mu_) = 0;
  int registrations_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> worker_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::RegisterWorker> registered_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Stream*> streams_ ABSL_GUARDED_BY(mu_);
  std::vector<Heard> heard_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, StreamEnd> ends_ ABSL_GUARDED_BY(mu_);
  absl::Duration pause_after_done_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> adopt_timeout_ms_{0};
};

}  // namespace testing
}  // namespace trainyard

#endif  // TRAINYARD_WORKER_FAKE_CONTROLLER_H_
