#include "controller/cli/job_client.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/npy.h"
#include "grpcpp/grpcpp.h"

namespace trainyard {

using trainyard::v1::Job;
using trainyard::v1::JobEvent;
using trainyard::v1::JobState;
using trainyard::v1::JobStateChange;

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

namespace {

bool Transient(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(timeout));
}

void MakeAbsolute(const std::string& base, std::string* path) {
  if (path->empty() || (*path)[0] == '/' || base.empty()) return;
  *path = base + "/" + *path;
}

void ResolveSource(const std::string& base, trainyard::v1::DataSource* src) {
  if (!src->has_npy()) return;
  MakeAbsolute(base, src->mutable_npy()->mutable_features());
  MakeAbsolute(base, src->mutable_npy()->mutable_targets());
}

}  // namespace

JobClient::JobClient(const std::string& controller_address,
                     absl::Duration rpc_timeout)
    : address_(controller_address), rpc_timeout_(rpc_timeout) {
  // Keepalive pings notice a controller that vanished without closing the
  // connection (a watch would otherwise wait on a half-open stream).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  channel_ = grpc::CreateCustomChannel(
      controller_address, grpc::InsecureChannelCredentials(), args);
  stub_ = trainyard::v1::JobService::NewStub(channel_);
}

absl::StatusOr<Job> JobClient::Submit(const trainyard::v1::JobSpec& spec,
                                      const std::string& request_id,
                                      int priority) {
  trainyard::v1::SubmitJobRequest req;
  req.set_request_id(request_id);
  *req.mutable_spec() = spec;
  req.set_priority(priority);
  // Retries are safe (the request id makes Submit idempotent) and ride out
  // a controller restart of a second or so; with no controller listening
  // each attempt fails at once (no wait_for_ready), so the whole call gives
  // up within about a second instead of waiting out its deadline.
  grpc::Status status;
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (attempt > 0) absl::SleepFor(absl::Milliseconds(100 << attempt));
    grpc::ClientContext ctx;
    SetDeadline(&ctx, rpc_timeout_);
    Job job;
    status = stub_->SubmitJob(&ctx, req, &job);
    if (status.ok()) return job;
    if (!Transient(status)) break;
  }
  return FromGrpcStatus(status);
}

absl::StatusOr<Job> JobClient::Get(const std::string& job_id) {
  trainyard::v1::GetJobRequest req;
  req.set_job_id(job_id);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, rpc_timeout_);
  Job job;
  grpc::Status status = stub_->GetJob(&ctx, req, &job);
  if (!status.ok()) return FromGrpcStatus(status);
  return job;
}

absl::StatusOr<trainyard::v1::ListJobsResponse> JobClient::List(
    const std::vector<JobState>& states, int page_size,
    const std::string& page_token) {
  trainyard::v1::ListJobsRequest req;
  for (JobState s : states) req.add_states(s);
  req.set_page_size(page_size);
  req.set_page_token(page_token);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, rpc_timeout_);
  trainyard::v1::ListJobsResponse resp;
  grpc::Status status = stub_->ListJobs(&ctx, req, &resp);
  if (!status.ok()) return FromGrpcStatus(status);
  return resp;
}

absl::StatusOr<Job> JobClient::Cancel(const std::string& job_id,
                                      const std::string& reason) {
  trainyard::v1::CancelJobRequest req;
  req.set_job_id(job_id);
  req.set_reason(reason);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, rpc_timeout_);
  Job job;
  grpc::Status status = stub_->CancelJob(&ctx, req, &job);
  if (!status.ok()) return FromGrpcStatus(status);
  return job;
}

absl::StatusOr<trainyard::v1::ListWorkersResponse> JobClient::ListWorkers() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, rpc_timeout_);
  trainyard::v1::ListWorkersResponse resp;
  grpc::Status status =
      stub_->ListWorkers(&ctx, trainyard::v1::ListWorkersRequest(), &resp);
  if (!status.ok()) return FromGrpcStatus(status);
  return resp;
}

absl::StatusOr<JobStateChange> JobClient::Watch(
    const std::string& job_id, int64_t from_step,
    const std::function<void(const JobEvent&)>& on_event,
    absl::Duration reconnect_for, const std::atomic<bool>* stop) {
  int64_t last_step = from_step - 1;  // last step event delivered
  int64_t last_eval = from_step - 1;  // last eval event delivered
  int32_t last_recovery = 0;          // last recovery attempt delivered
  JobState last_state = trainyard::v1::JOB_STATE_UNSPECIFIED;
  auto stopped = [&] { return stop != nullptr && stop->load(); };
  // The current stream's context, so the stop watcher can cancel it.
  absl::Mutex mu;
  grpc::ClientContext* current = nullptr;
  bool done = false;
  std::thread stop_watcher;
  if (stop != nullptr) {
    stop_watcher = std::thread([&] {
      absl::MutexLock lock(&mu);
      while (!done) {
        mu.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(100));
        if (stop->load() && current != nullptr) current->TryCancel();
      }
    });
  }
  auto finish = [&](absl::StatusOr<JobStateChange> result) {
    {
      absl::MutexLock lock(&mu);
      done = true;
    }
    if (stop_watcher.joinable()) stop_watcher.join();
    return result;
  };
  absl::Time give_up = absl::Now() + reconnect_for;
  std::string last_error = "not connected";
  while (true) {
    if (stopped()) return finish(absl::CancelledError("watch interrupted"));
    if (absl::Now() > give_up) {
      return finish(absl::UnavailableError(absl::StrCat(
          "cannot reach ", address_, " (tried for ",
          absl::FormatDuration(reconnect_for), "): ", last_error)));
    }
    // Wait (boundedly, and interruptibly) for a connection.
    const absl::Time wait_until =
        std::min(give_up, absl::Now() + absl::Milliseconds(200));
    if (!channel_->WaitForConnected(absl::ToChronoTime(wait_until))) continue;

    trainyard::v1::WatchJobRequest req;
    req.set_job_id(job_id);
    // Resume at the older of the two cursors; duplicates are dropped below.
    req.set_from_step(std::max<int64_t>(0, std::min(last_step, last_eval) + 1));
    grpc::ClientContext ctx;
    {
      absl::MutexLock lock(&mu);
      current = &ctx;
    }
    auto reader = stub_->WatchJob(&ctx, req);
    JobEvent event;
    std::optional<JobStateChange> terminal;
    while (reader->Read(&event)) {
      give_up = absl::Now() + reconnect_for;  // the controller is alive
      if (event.has_step()) {
        if (event.step().step() <= last_step) continue;
        last_step = event.step().step();
      } else if (event.has_eval()) {
        if (event.eval().step() <= last_eval) continue;
        last_eval = event.eval().step();
      } else if (event.has_recovery()) {
        if (event.recovery().attempt() <= last_recovery) continue;
        last_recovery = event.recovery().attempt();
      } else if (event.has_state()) {
        if (event.state().state() == last_state) continue;
        last_state = event.state().state();
      }
      on_event(event);
      if (event.has_state() && IsTerminal(event.state().state())) {
        terminal = event.state();
        ctx.TryCancel();
        break;
      }
    }
    grpc::Status status = reader->Finish();
    {
      absl::MutexLock lock(&mu);
      current = nullptr;
    }
    if (terminal.has_value()) return finish(*terminal);
    if (stopped()) return finish(absl::CancelledError("watch interrupted"));
    if (!status.ok() && !Transient(status) &&
        status.error_code() != grpc::StatusCode::CANCELLED &&
        status.error_code() != grpc::StatusCode::INTERNAL) {
      return finish(FromGrpcStatus(status));
    }
    // The stream ended without a terminal state: reconnect.
    last_error =
        status.ok() ? "the stream ended early" : status.error_message();
    absl::SleepFor(absl::Milliseconds(100));
  }
}

std::string NewRequestId() {
  unsigned char bytes[16] = {0};
  int fd = open("/dev/urandom", O_RDONLY);
  if (fd >= 0) {
    ssize_t n = read(fd, bytes, sizeof(bytes));
    (void)n;
    close(fd);
  }
  std::string out = "req-";
  char hex[3];
  for (unsigned char b : bytes) {
    std::snprintf(hex, sizeof(hex), "%02x", b);
    out += hex;
  }
  return out;
}

void ResolveSpecPaths(const std::string& base_dir,
                      trainyard::v1::JobSpec* spec) {
  auto* data = spec->mutable_data();
  if (data->has_train()) ResolveSource(base_dir, data->mutable_train());
  if (data->has_eval()) ResolveSource(base_dir, data->mutable_eval());
  if (spec->has_model() && spec->model().has_init()) {
    MakeAbsolute(base_dir,
                 spec->mutable_model()->mutable_init()->mutable_safetensors());
  }
  if (spec->has_checkpoint()) {
    MakeAbsolute(base_dir, spec->mutable_checkpoint()->mutable_dir());
  }
}

void FillInputWidthFromLocalData(trainyard::v1::JobSpec* spec) {
  if (spec->model().blocks_size() == 0 ||
      spec->model().blocks(0).in_features() != 0 ||
      !spec->data().train().has_npy()) {
    return;
  }
  absl::StatusOr<NpyHeader> header =
      ReadNpyHeader(spec->data().train().npy().features());
  if (!header.ok() || header->shape.size() != 2)
    return;  // the workers will say
  spec->mutable_model()->mutable_blocks(0)->set_in_features(header->shape[1]);
}

const char* JobStateName(JobState state) {
  switch (state) {
    case trainyard::v1::QUEUED:
      return "QUEUED";
    case trainyard::v1::RUNNING:
      return "RUNNING";
    case trainyard::v1::RECOVERING:
      return "RECOVERING";
    case trainyard::v1::SUCCEEDED:
      return "SUCCEEDED";
    case trainyard::v1::FAILED:
      return "FAILED";
    case trainyard::v1::CANCELLED:
      return "CANCELLED";
    default:
      return "UNSPECIFIED";
  }
}

bool IsTerminal(JobState state) {
  return state == trainyard::v1::SUCCEEDED || state == trainyard::v1::FAILED ||
         state == trainyard::v1::CANCELLED;
}

}  // namespace trainyard
