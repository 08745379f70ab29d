#include "core/rendezvous.h"

#include <utility>

#include "absl/strings/str_cat.h"

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

}  // namespace trainyard
