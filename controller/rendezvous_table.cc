#include "controller/rendezvous_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainyard {
namespace {

using Reply = RendezvousTable::Reply;

Reply ErrorReply(const std::string& worker_id, int64_t request_id,
                 const absl::Status& status) {
  Reply r;
  r.worker_id = worker_id;
  r.reply.set_request_id(request_id);
  r.reply.set_code(static_cast<int32_t>(status.code()));
  r.reply.set_error(std::string(status.message()));
  return r;
}

Reply ValueReply(const std::string& worker_id, int64_t request_id,
                 const std::string& value) {
  Reply r;
  r.worker_id = worker_id;
  r.reply.set_request_id(request_id);
  r.reply.set_value(value);
  return r;
}

// A key as it appears in errors: quoted, and shortened when it is one of
// the too long ones.
std::string QuoteKey(const std::string& key) {
  constexpr size_t kShown = 64;
  if (key.size() <= kShown) return absl::StrCat("\"", key, "\"");
  return absl::StrCat("\"", key.substr(0, kShown), "...\"");
}

}  // namespace

std::string RendezvousTable::Prefix(const std::string& job_id) {
  return absl::StrCat("rendezvous of job ", job_id, ": ");
}

absl::Status RendezvousTable::CheckKey(const std::string& job_id,
                                       const std::string& key) const {
  if (key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Prefix(job_id), "the key is empty"));
  }
  if (key.size() > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(Prefix(job_id), "key ", QuoteKey(key), " is ", key.size(),
                     " bytes; the limit is ", limits_.max_key_bytes));
  }
  return absl::OkStatus();
}

void RendezvousTable::Open(const std::string& job_id) {
  jobs_[job_id] = JobStore();
}

std::vector<Reply> RendezvousTable::Close(const std::string& job_id,
                                          const absl::Status& status) {
  std::vector<Reply> out;
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return out;
  const absl::Status why =
      status.ok() ? absl::AbortedError(absl::StrCat(Prefix(job_id), "closed"))
                  : status;
  for (const PendingGet& g : it->second.waiting) {
    out.push_back(ErrorReply(g.worker_id, g.request_id, why));
  }
  jobs_.erase(it);
  return out;
}

bool RendezvousTable::IsOpen(const std::string& job_id) const {
  return jobs_.count(job_id) > 0;
}

void RendezvousTable::Postpone(absl::Duration by) {
  for (auto& [job_id, store] : jobs_) {
    for (PendingGet& g : store.waiting) g.deadline += by;
  }
}

int RendezvousTable::PendingGets(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? 0 : static_cast<int>(it->second.waiting.size());
}

std::vector<Reply> RendezvousTable::Put(const std::string& worker_id,
                                        const v1::RendezvousPut& put) {
  const std::string& job_id = put.job_id();
  auto error = [&](const absl::Status& status) {
    return std::vector<Reply>{ErrorReply(worker_id, put.request_id(), status)};
  };
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return error(absl::FailedPreconditionError(
        absl::StrCat(Prefix(job_id), "the job is not running")));
  }
  if (absl::Status st = CheckKey(job_id, put.key()); !st.ok()) {
    return error(st);
  }
  if (put.value().size() > limits_.max_value_bytes) {
    return error(absl::InvalidArgumentError(absl::StrCat(
        Prefix(job_id), "the value of key ", QuoteKey(put.key()), " is ",
        put.value().size(), " bytes; the limit is ", limits_.max_value_bytes)));
  }
  JobStore& store = it->second;
  auto existing = store.values.find(put.key());
  if (existing != store.values.end()) {
    if (existing->second != put.value()) {
      return error(absl::AlreadyExistsError(
          absl::StrCat(Prefix(job_id), "key ", QuoteKey(put.key()),
                       " already holds a different ", existing->second.size(),
                       "-byte value; keys are write-once")));
    }
    // A retried Put: no-op.
    return {ValueReply(worker_id, put.request_id(), "")};
  }
  if (static_cast<int>(store.values.size()) >= limits_.max_keys_per_job) {
    return error(absl::ResourceExhaustedError(
        absl::StrCat(Prefix(job_id), "cannot add key ", QuoteKey(put.key()),
                     ": the job already holds ", store.values.size(),
                     " keys; the limit is ", limits_.max_keys_per_job)));
  }
  store.values.emplace(put.key(), put.value());
  std::vector<Reply> out = {ValueReply(worker_id, put.request_id(), "")};
  auto waiting_for_key = [&](const PendingGet& g) {
    return g.key == put.key();
  };
  for (const PendingGet& g : store.waiting) {
    if (waiting_for_key(g)) {
      out.push_back(ValueReply(g.worker_id, g.request_id, put.value()));
    }
  }
  store.waiting.erase(std::remove_if(store.waiting.begin(), store.waiting.end(),
                                     waiting_for_key),
                      store.waiting.end());
  return out;
}

std::vector<Reply> RendezvousTable::Get(const std::string& worker_id,
                                        const v1::RendezvousGet& get,
                                        absl::Time now) {
  const std::string& job_id = get.job_id();
  auto error = [&](const absl::Status& status) {
    return std::vector<Reply>{ErrorReply(worker_id, get.request_id(), status)};
  };
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return error(absl::FailedPreconditionError(
        absl::StrCat(Prefix(job_id), "the job is not running")));
  }
  if (absl::Status st = CheckKey(job_id, get.key()); !st.ok()) {
    return error(st);
  }
  JobStore& store = it->second;
  auto found = store.values.find(get.key());
  if (found != store.values.end()) {
    return {ValueReply(worker_id, get.request_id(), found->second)};
  }
  const absl::Duration asked =
      absl::Milliseconds(std::max<int64_t>(get.timeout_ms(), 0));
  const absl::Duration timeout = std::min(asked, limits_.max_get_timeout);
  if (timeout <= absl::ZeroDuration()) {
    return error(absl::DeadlineExceededError(
        absl::StrCat(Prefix(job_id), "key ", QuoteKey(get.key()),
                     " has not been put (the Get did not wait)")));
  }
  if (static_cast<int>(store.waiting.size()) >=
      limits_.max_pending_gets_per_job) {
    return error(absl::ResourceExhaustedError(absl::StrCat(
        Prefix(job_id), "cannot wait for key ", QuoteKey(get.key()), ": ",
        store.waiting.size(), " Gets already wait in this job; the limit is ",
        limits_.max_pending_gets_per_job)));
  }
  store.waiting.push_back({worker_id, get.request_id(), get.key(), timeout,
                           asked > timeout, now + timeout});
  return {};
}

std::vector<Reply> RendezvousTable::Expire(absl::Time now) {
  std::vector<Reply> out;
  for (auto& [job_id, store] : jobs_) {
    auto expired = [&](const PendingGet& g) { return g.deadline <= now; };
    for (const PendingGet& g : store.waiting) {
      if (!expired(g)) continue;
      out.push_back(ErrorReply(
          g.worker_id, g.request_id,
          absl::DeadlineExceededError(absl::StrCat(
              Prefix(job_id), "key ", QuoteKey(g.key), " was not put within ",
              absl::FormatDuration(g.timeout),
              g.capped ? " (the controller caps a Get's timeout there)"
                       : ""))));
    }
    store.waiting.erase(
        std::remove_if(store.waiting.begin(), store.waiting.end(), expired),
        store.waiting.end());
  }
  return out;
}

}  // namespace trainyard
