#include "engine/job_log.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace trainyard {
namespace {

thread_local ScopedJobLog* t_scope = nullptr;

// Hands the lines logged under a ScopedJobLog to its forwarder. Runs with
// glog's lock held: it must neither log nor block.
class JobLogSink final : public google::LogSink {
 public:
  void send(google::LogSeverity severity, const char* /*full_filename*/,
            const char* /*base_filename*/, int /*line*/,
            const google::LogMessageTime& time, const char* message,
            size_t message_len) override {
    ScopedJobLog* scope = t_scope;
    if (scope == nullptr || scope->forwarder() == nullptr) return;
    const int64_t time_ms =
        static_cast<int64_t>(time.timestamp()) * 1000 + time.usec() / 1000;
    scope->forwarder()->Add(scope->job_id(), scope->stage(), severity, time_ms,
                            absl::string_view(message, message_len));
  }
};

void InstallSink() {
  static std::once_flag once;
  std::call_once(once, [] { google::AddLogSink(new JobLogSink()); });
}

v1::LogSeverity SeverityOf(int glog_severity) {
  switch (glog_severity) {
    case google::GLOG_INFO:
      return v1::LOG_SEVERITY_INFO;
    case google::GLOG_WARNING:
      return v1::LOG_SEVERITY_WARNING;
    default:
      return v1::LOG_SEVERITY_ERROR;
  }
}

// Bytes of the valid UTF-8 character starting at text[i], or 0 when the
// bytes there are not one.
size_t Utf8CharLength(absl::string_view text, size_t i) {
  auto at = [&](size_t k) -> unsigned {
    return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0;
  };
  auto cont = [&](size_t k) { return (at(k) & 0xC0) == 0x80; };
  const unsigned c = at(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    // No overlong forms (E0 80..9F) and no surrogates (ED A0..BF).
    if (c == 0xE0 && at(1) < 0xA0) return 0;
    if (c == 0xED && at(1) > 0x9F) return 0;
    return cont(1) && cont(2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (c == 0xF0 && at(1) < 0x90) return 0;
    if (c == 0xF4 && at(1) > 0x8F) return 0;
    return cont(1) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

}  // namespace

std::string SanitizeUtf8(absl::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = Utf8CharLength(text, i);
    const size_t take = n == 0 ? 1 : n;
    if (out.size() + take > max_bytes) break;
    if (n == 0) {
      out.push_back('?');
    } else {
      out.append(text.data() + i, n);
    }
    i += take;
  }
  return out;
}

JobLogForwarder::JobLogForwarder(
    std::function<bool(const v1::WorkerMessage&)> send, JobLogOptions options)
    : send_(std::move(send)),
      options_(std::move(options)),
      tokens_(options_.burst),
      refilled_(absl::Now()) {
  InstallSink();
  thread_ = std::thread([this] { Loop(); });
}

JobLogForwarder::~JobLogForwarder() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void JobLogForwarder::Add(const std::string& job_id, int stage, int severity,
                          int64_t time_ms, absl::string_view text) {
  if (!options_.drop_prefix.empty()) {
    absl::ConsumePrefix(&text, options_.drop_prefix);
  }
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  tokens_ = std::min(options_.burst,
                     tokens_ + options_.lines_per_second *
                                   absl::ToDoubleSeconds(now - refilled_));
  refilled_ = now;
  if (tokens_ < 1 || queue_.size() >= options_.max_queued) {
    ++dropped_;
    ++dropped_unsaid_;
    return;
  }
  tokens_ -= 1;
  v1::WorkerMessage m;
  v1::StageLogLine* line = m.mutable_log();
  line->set_job_id(job_id);
  line->set_stage(stage);
  line->set_time_ms(time_ms);
  if (dropped_unsaid_ > 0) {
    line->set_severity(v1::LOG_SEVERITY_WARNING);
    line->set_text(absl::StrCat("(worker) ", dropped_unsaid_,
                                " line(s) dropped: more than ",
                                options_.lines_per_second, " lines/s or ",
                                options_.max_queued, " waiting"));
    queue_.push_back(m);
    dropped_unsaid_ = 0;
  }
  line->set_severity(SeverityOf(severity));
  line->set_text(SanitizeUtf8(text, options_.max_line_bytes));
  queue_.push_back(std::move(m));
}

void JobLogForwarder::SendQueued() {
  std::deque<v1::WorkerMessage> batch;
  {
    absl::MutexLock lock(&mu_);
    batch.swap(queue_);
  }
  for (const v1::WorkerMessage& m : batch) send_(m);
}

void JobLogForwarder::Flush() {
  absl::MutexLock lock(&send_mu_);
  SendQueued();
}

void JobLogForwarder::Loop() {
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  };
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
    }
    absl::MutexLock lock(&send_mu_);
    SendQueued();
  }
}

int64_t JobLogForwarder::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

ScopedJobLog::ScopedJobLog(JobLogForwarder* forwarder, std::string job_id,
                           int stage)
    : forwarder_(forwarder),
      job_id_(std::move(job_id)),
      stage_(stage),
      outer_(t_scope) {
  t_scope = this;
}

ScopedJobLog::~ScopedJobLog() { t_scope = outer_; }

}  // namespace trainyard
