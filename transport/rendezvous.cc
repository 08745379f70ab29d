#include "transport/rendezvous.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace trainyard {

absl::Status InProcessRendezvous::Put(const std::string& key,
                                      std::string value) {
  if (key.empty()) {
    return absl::InvalidArgumentError("rendezvous: Put with an empty key");
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = values_.try_emplace(key, std::move(value));
  if (!inserted && it->second != value) {
    // try_emplace leaves `value` untouched when the key exists.
    return absl::AlreadyExistsError(
        absl::StrCat("rendezvous: key \"", key, "\" already holds a different ",
                     it->second.size(), "-byte value; keys are write-once"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> InProcessRendezvous::Get(const std::string& key,
                                                     absl::Duration timeout) {
  if (key.empty()) {
    return absl::InvalidArgumentError("rendezvous: Get with an empty key");
  }
  absl::MutexLock lock(&mu_);
  auto present = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return values_.count(key) > 0;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous: key \"", key, "\" was not put within ",
                     absl::FormatDuration(timeout)));
  }
  return values_.at(key);
}

namespace {

// Process-wide, so ids never repeat across RemoteRendezvous objects that
// share one connection (one per job on a worker's stream).
std::atomic<int64_t> next_request_id{1};

}  // namespace

RemoteRendezvous::RemoteRendezvous(std::string remote, Sender send,
                                   absl::Duration reply_timeout)
    : remote_(std::move(remote)),
      send_(std::move(send)),
      reply_timeout_(reply_timeout) {}

absl::Status RemoteRendezvous::Put(const std::string& key, std::string value) {
  if (key.empty()) {
    return absl::InvalidArgumentError("rendezvous: Put with an empty key");
  }
  Request request;
  request.kind = Request::Kind::kPut;
  request.key = key;
  request.value = std::move(value);
  return Call(std::move(request), absl::Now() + reply_timeout_).status();
}

absl::StatusOr<std::string> RemoteRendezvous::Get(const std::string& key,
                                                  absl::Duration timeout) {
  if (key.empty()) {
    return absl::InvalidArgumentError("rendezvous: Get with an empty key");
  }
  Request request;
  request.kind = Request::Kind::kGet;
  request.key = key;
  request.timeout = std::max(timeout, absl::ZeroDuration());
  return Call(std::move(request),
              absl::Now() + request.timeout + reply_timeout_);
}

absl::StatusOr<std::string> RemoteRendezvous::Call(Request request,
                                                   absl::Time deadline) {
  const char* what = request.kind == Request::Kind::kPut ? "Put" : "Get";
  const std::string key = request.key;
  request.id = next_request_id.fetch_add(1);
  const int64_t id = request.id;
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return aborted_;
    pending_.insert(id);
  }
  // Sent without the lock: the sender may block, and its reply may come
  // back (OnReply) before it returns.
  if (!send_(request)) {
    absl::MutexLock lock(&mu_);
    pending_.erase(id);
    replies_.erase(id);
    if (!aborted_.ok()) return aborted_;
    return absl::UnavailableError(
        absl::StrCat("rendezvous: cannot send the ", what, " of key \"", key,
                     "\" to ", remote_, ": the connection is down"));
  }
  absl::MutexLock lock(&mu_);
  auto answered = [this, id]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !aborted_.ok() || replies_.count(id) > 0;
  };
  mu_.AwaitWithDeadline(absl::Condition(&answered), deadline);
  pending_.erase(id);
  auto it = replies_.find(id);
  if (it != replies_.end()) {
    absl::StatusOr<std::string> result = std::move(it->second);
    replies_.erase(it);
    return result;
  }
  if (!aborted_.ok()) return aborted_;
  return absl::DeadlineExceededError(
      absl::StrCat("rendezvous: no reply from ", remote_, " to the ", what,
                   " of key \"", key, "\" by its deadline"));
}

void RemoteRendezvous::OnReply(int64_t request_id,
                               absl::StatusOr<std::string> result) {
  absl::MutexLock lock(&mu_);
  if (pending_.count(request_id) == 0) return;  // the caller gave up
  replies_.insert_or_assign(request_id, std::move(result));
}

void RemoteRendezvous::Abort(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!aborted_.ok()) return;
  aborted_ = status.ok() ? absl::AbortedError("rendezvous aborted") : status;
}

}  // namespace trainyard
