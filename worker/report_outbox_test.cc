#include "worker/report_outbox.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

// The lines logged while it is installed, with their severity.
class CapturedLog final : public google::LogSink {
 public:
  CapturedLog() { google::AddLogSink(this); }
  ~CapturedLog() override { google::RemoveLogSink(this); }

  void send(google::LogSeverity severity, const char*, const char*, int,
            const google::LogMessageTime&, const char* message,
            size_t message_len) override {
    absl::MutexLock lock(&mu_);
    lines_.push_back({severity, std::string(message, message_len)});
  }
  std::vector<std::pair<google::LogSeverity, std::string>> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<google::LogSeverity, std::string>> lines_;
};

v1::WorkerMessage StepReport(int64_t step) {
  v1::WorkerMessage m;
  m.mutable_step()->mutable_step()->set_step(step);
  return m;
}

// Past kMaxKeptReports, a worker whose controller hears every report notes
// at INFO that only the newest are kept; one whose controller is away
// warns that reports are dropped unsent. Each once per job.
TEST(ReportOutboxTest, PastTheLimitSaysWhetherReportsWentUnsent) {
  ReportOutbox outbox("w0");
  Session live;  // its writes are closed: Write refuses, touching no stream
  {
    absl::MutexLock lock(&live.write_mu);
    live.writes_closed = true;
  }
  CapturedLog log;
  outbox.Attach(&live, absl::ZeroDuration());
  const int64_t limit = ReportOutbox::kMaxKeptReports;
  for (int64_t i = 0; i < limit + 10; ++i) outbox.Report(StepReport(i));
  outbox.Detach(&live);
  for (int64_t i = 0; i < 10; ++i) outbox.Report(StepReport(limit + 10 + i));
  outbox.StartJob();  // a new job: said again
  for (int64_t i = 0; i < limit + 1; ++i) outbox.Report(StepReport(i));
  const std::string kept =
      "trainyard-worker w0: keeping only the newest 16384 reports for "
      "resending after a reconnect";
  const std::string unsent =
      "trainyard-worker w0: the controller has been away for more than "
      "16384 reports; the oldest are dropped unsent";
  EXPECT_THAT(log.lines(), ElementsAre(Pair(google::GLOG_INFO, kept),
                                       Pair(google::GLOG_WARNING, unsent),
                                       Pair(google::GLOG_WARNING, unsent)));
}

}  // namespace
}  // namespace trainyard
