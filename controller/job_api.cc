#include "controller/job_api.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "engine/task_loader.h"

namespace trainyard {
namespace {

// Client-chosen strings that are stored with a job.
constexpr size_t kMaxRequestIdBytes = 256;
constexpr size_t kMaxCancelReasonBytes = 1024;

constexpr int kDefaultPageSize = 50;
constexpr size_t kMaxListResponseBytes = size_t{2} << 20;
constexpr int kMaxPageSize = 1000;
constexpr char kTokenPrefix[] = "before:";

absl::Status CheckRequestId(const std::string& request_id) {
  if (request_id.empty()) {
    return absl::InvalidArgumentError(
        "request_id: required (a client-chosen idempotency key)");
  }
  if (request_id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: ", request_id.size(), " bytes, limit ",
                     kMaxRequestIdBytes));
  }
  return absl::OkStatus();
}

// A job found under the caller's request key is returned only to its
// owner: an owner-less job (from --insecure) whose request id was
// "alice:r1" has alice's key for "r1" too.
absl::StatusOr<v1::Job> AlreadySubmitted(const v1::Job& job,
                                         const Caller& caller) {
  if (job.owner() != caller.user) {
    return absl::AlreadyExistsError(
        "request_id: already used by another job; pick another one");
  }
  return job;
}

// With a plugin folder, the task plugin's own check of the spec's
// task.config (InvalidArgument for an unknown plugin).
absl::Status CheckTaskConfig(const std::string& plugin_dir,
                             const v1::JobSpec& spec) {
  if (plugin_dir.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::string config, TaskConfigJson(spec));
  absl::StatusOr<ConfigCheck> check =
      ValidateTaskConfig(plugin_dir, spec.task().plugin(), config);
  if (absl::IsNotFound(check.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.plugin: ", check.status().message()));
  }
  return check.status();
}

// The `before` of a ListJobs page token (0 for the first page).
absl::StatusOr<int64_t> ParsePageToken(const std::string& token) {
  int64_t before = 0;
  if (token.empty()) return before;
  std::string decoded;
  if (!absl::WebSafeBase64Unescape(token, &decoded) ||
      !absl::StartsWith(decoded, kTokenPrefix) ||
      !absl::SimpleAtoi(decoded.substr(sizeof(kTokenPrefix) - 1), &before) ||
      before <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token: not a token from ListJobs: ", Quote(token)));
  }
  return before;
}

absl::StatusOr<std::vector<v1::JobState>> ParseStates(
    const v1::ListJobsRequest& request) {
  std::vector<v1::JobState> states;
  for (int i = 0; i < request.states_size(); ++i) {
    v1::JobState s = request.states(i);
    if (!v1::JobState_IsValid(s) || s == v1::JOB_STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("states[", i, "]: not a job state: ", int{s}));
    }
    states.push_back(s);
  }
  return states;
}

}  // namespace

absl::StatusOr<v1::Job> JobApi::SubmitJob(const v1::SubmitJobRequest& request,
                                          const Caller& caller) {
  RETURN_IF_ERROR(CheckRequestId(request.request_id()));
  const std::string key = RequestKey(caller.user, request.request_id());
  {
    absl::MutexLock lock(&s_.mu);
    if (const JobEntry* e = FindRequestLocked(key)) {
      return AlreadySubmitted(e->job, caller);
    }
  }
  absl::StatusOr<JobPlan> plan =
      PlanJob(request.spec(), ControllerPlanOptions(s_.options));
  // PlanJob's message already lists every problem with its field path.
  if (!plan.ok()) return plan.status();
  RETURN_IF_ERROR(CheckTaskConfig(s_.options.plugin_dir, request.spec()));
  v1::Job result;
  {
    absl::MutexLock lock(&s_.mu);
    if (s_.shutting_down) {
      return absl::UnavailableError("controller shutting down");
    }
    if (const JobEntry* e = FindRequestLocked(key)) {
      return AlreadySubmitted(e->job, caller);
    }
    ASSIGN_OR_RETURN(result, AddJobLocked(request, key, caller, *plan));
  }
  s_.outbox.Deliver();
  return result;
}

const JobEntry* JobApi::FindRequestLocked(const std::string& key) {
  auto it = s_.job_by_request.find(key);
  return it == s_.job_by_request.end() ? nullptr : s_.jobs.at(it->second).get();
}

absl::StatusOr<v1::Job> JobApi::AddJobLocked(
    const v1::SubmitJobRequest& request, const std::string& key,
    const Caller& caller, const JobPlan& plan) {
  v1::Job job;
  job.set_request_id(request.request_id());
  job.set_owner(caller.user);
  *job.mutable_spec() = request.spec();
  job.set_priority(request.priority());
  job.set_create_time_ms(absl::ToUnixMillis(absl::Now()));
  ASSIGN_OR_RETURN(JobStore::Created created, s_.store->CreateJob(job));
  auto e = std::make_unique<JobEntry>();
  e->job = std::move(created.job);
  // Jobs never leave, so the count numbers them in order.
  e->submit_order = static_cast<int64_t>(s_.jobs.size()) + 1;
  SetPlan(*e, plan);
  const std::string id = e->job.job_id();
  s_.job_by_request[key] = id;
  s_.jobs[id] = std::move(e);
  if (created.created) {
    // The history starts with the QUEUED state, stored as event 0.
    records_.EventLogLocked(*s_.jobs.at(id));
    s_.queued.insert(id);
  }
  gangs_.ScheduleLocked();
  return s_.jobs.at(id)->job;
}

absl::StatusOr<JobEntry*> JobApi::FindJobLocked(const std::string& job_id,
                                                const Caller& caller,
                                                const char* verb) {
  auto it = s_.jobs.find(job_id);
  if (it == s_.jobs.end()) {
    return absl::NotFoundError(
        absl::StrCat("job ", Quote(job_id), ": not found"));
  }
  if (!caller.admin && it->second->job.owner() != caller.user) {
    return absl::PermissionDeniedError(
        absl::StrCat("job ", job_id,
                     " belongs to another user: only its owner or an "
                     "admin may ",
                     verb, " it"));
  }
  return it->second.get();
}

absl::StatusOr<v1::Job> JobApi::GetJob(const std::string& job_id,
                                       const Caller& caller) {
  absl::MutexLock lock(&s_.mu);
  ASSIGN_OR_RETURN(JobEntry * e, FindJobLocked(job_id, caller, "see"));
  v1::Job job = e->job;
  job.set_tensorboard_dir(telemetry_.TensorboardDir(job_id));
  return job;
}

absl::StatusOr<v1::ListJobsResponse> JobApi::ListJobs(
    const v1::ListJobsRequest& request, const Caller& caller) {
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must be >= 0, got ", request.page_size()));
  }
  const int limit = request.page_size() == 0
                        ? kDefaultPageSize
                        : std::min(request.page_size(), kMaxPageSize);
  ASSIGN_OR_RETURN(const int64_t before, ParsePageToken(request.page_token()));
  ASSIGN_OR_RETURN(const std::vector<v1::JobState> states,
                   ParseStates(request));
  int64_t next_before = 0;
  ASSIGN_OR_RETURN(
      std::vector<v1::Job> jobs,
      s_.store->ListJobs(states, caller.admin ? nullptr : &caller.user, limit,
                         before, &next_before));
  v1::ListJobsResponse response;
  size_t bytes = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    // A page stays well under the 4 MiB gRPC message limit whatever the
    // jobs hold; the next page starts at the first job left out.
    const size_t n = jobs[i].ByteSizeLong();
    int64_t seq = 0;
    if (i > 0 && bytes + n > kMaxListResponseBytes &&
        absl::SimpleAtoi(absl::StripPrefix(jobs[i].job_id(), "job-"), &seq)) {
      next_before = seq + 1;
      break;
    }
    bytes += n;
    jobs[i].set_tensorboard_dir(telemetry_.TensorboardDir(jobs[i].job_id()));
    *response.add_jobs() = std::move(jobs[i]);
  }
  if (next_before > 0) {
    response.set_next_page_token(
        absl::WebSafeBase64Escape(absl::StrCat(kTokenPrefix, next_before)));
  }
  return response;
}

absl::StatusOr<v1::Job> JobApi::CancelJob(const v1::CancelJobRequest& request,
                                          const Caller& caller) {
  if (request.reason().size() > kMaxCancelReasonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("reason: ", request.reason().size(), " bytes, limit ",
                     kMaxCancelReasonBytes));
  }
  v1::Job result;
  {
    absl::MutexLock lock(&s_.mu);
    ASSIGN_OR_RETURN(JobEntry * found,
                     FindJobLocked(request.job_id(), caller, "cancel"));
    JobEntry& e = *found;
    if (IsTerminal(e.job.state())) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", e.job.job_id(), " is already ",
                       v1::JobState_Name(e.job.state()),
                       "; only QUEUED, RUNNING or RECOVERING jobs "
                       "can be cancelled"));
    }
    if (s_.shutting_down) {
      return absl::UnavailableError("controller shutting down");
    }
    // Who asked is part of the record (on a --insecure controller nobody
    // is known).
    const std::string by = caller.user.empty()
                               ? std::string("cancelled by request")
                               : absl::StrCat("cancelled by ", caller.user);
    const std::string reason = request.reason().empty()
                                   ? by
                                   : absl::StrCat(by, ": ", request.reason());
    const bool running =
        e.job.state() == v1::RUNNING || e.job.state() == v1::RECOVERING;
    records_.FinishJobLocked(e, v1::CANCELLED, reason,
                             /*cancel_workers=*/running);
    gangs_.ScheduleLocked();
    result = e.job;
  }
  s_.outbox.Deliver();
  return result;
}

absl::StatusOr<std::shared_ptr<JobEventLog>> JobApi::WatchJob(
    const std::string& job_id, const Caller& caller) {
  absl::MutexLock lock(&s_.mu);
  ASSIGN_OR_RETURN(JobEntry * e, FindJobLocked(job_id, caller, "watch"));
  records_.EventLogLocked(*e);
  return e->event_log;
}

absl::StatusOr<v1::GetTraceResponse> JobApi::GetTrace(
    const v1::GetTraceRequest& request, const Caller& caller) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step: must be >= 0 (0 = the newest), got ", request.step()));
  }
  absl::MutexLock lock(&s_.mu);
  ASSIGN_OR_RETURN(JobEntry * e,
                   FindJobLocked(request.job_id(), caller, "see"));
  if (e->traces == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "job ", e->job.job_id(), ": no step traces held (",
        e->job.state() == v1::QUEUED
            ? std::string("it has not run yet")
            : absl::StrCat("the controller keeps them in memory for jobs "
                           "that have not ended and the ",
                           s_.options.keep_ended_jobs,
                           " that ended last, and not across its restarts"),
        ")"));
  }
  return e->traces->Get(e->job.job_id(), request.step());
}

absl::StatusOr<std::shared_ptr<LogRing>> JobApi::WatchLogs(
    const std::string& job_id, const Caller& caller) {
  absl::MutexLock lock(&s_.mu);
  ASSIGN_OR_RETURN(JobEntry * e, FindJobLocked(job_id, caller, "watch"));
  if (telemetry_.LogRingLocked(*e) == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "job ", job_id, " ended ", v1::JobState_Name(e->job.state()),
        " and its log lines are no longer kept (the controller keeps them "
        "in memory for jobs that have not ended and the ",
        s_.options.keep_ended_jobs,
        " that ended last, and not across its restarts)"));
  }
  return e->log_ring;
}

}  // namespace trainyard
