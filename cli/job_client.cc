#include "cli/job_client.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/npy.h"
#include "core/sha256.h"
#include "core/status_macros.h"
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
  if (src->has_npy_shards()) {
    auto* shards = src->mutable_npy_shards();
    for (std::string& entry : *shards->mutable_features()) {
      MakeAbsolute(base, &entry);
    }
    for (std::string& entry : *shards->mutable_targets()) {
      MakeAbsolute(base, &entry);
    }
    return;
  }
  if (!src->has_npy()) return;
  MakeAbsolute(base, src->mutable_npy()->mutable_features());
  MakeAbsolute(base, src->mutable_npy()->mutable_targets());
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobClient>> JobClient::Create(
    const std::string& controller_address, const JobClientSecurity& security,
    absl::Duration rpc_timeout) {
  // Keepalive pings notice a controller that vanished without closing the
  // connection (a watch would otherwise wait on a half-open stream).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> creds,
                   MakeChannelCredentials(security.tls, &args));
  std::unique_ptr<JobClient> client(new JobClient());
  client->address_ = controller_address;
  client->rpc_timeout_ = rpc_timeout;
  // A plaintext controller (--insecure) checks no token, and a token sent
  // in the clear is a token given to whoever answers: never send one.
  client->token_ = security.tls.insecure ? std::string() : security.token;
  client->tls_ = !security.tls.insecure;
  client->channel_ = grpc::CreateCustomChannel(controller_address, creds, args);
  client->stub_ = trainyard::v1::JobService::NewStub(client->channel_);
  return client;
}

void JobClient::Prepare(grpc::ClientContext* ctx, bool deadline) const {
  if (deadline) SetDeadline(ctx, rpc_timeout_);
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
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
    Prepare(&ctx);
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
  Prepare(&ctx);
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
  Prepare(&ctx);
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
  Prepare(&ctx);
  Job job;
  grpc::Status status = stub_->CancelJob(&ctx, req, &job);
  if (!status.ok()) return FromGrpcStatus(status);
  return job;
}

absl::StatusOr<trainyard::v1::ListWorkersResponse> JobClient::ListWorkers() {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  trainyard::v1::ListWorkersResponse resp;
  grpc::Status status =
      stub_->ListWorkers(&ctx, trainyard::v1::ListWorkersRequest(), &resp);
  if (!status.ok()) return FromGrpcStatus(status);
  return resp;
}

absl::StatusOr<trainyard::v1::GetTraceResponse> JobClient::GetTrace(
    const std::string& job_id, int64_t step) {
  trainyard::v1::GetTraceRequest req;
  req.set_job_id(job_id);
  req.set_step(step);
  grpc::ClientContext ctx;
  Prepare(&ctx);
  trainyard::v1::GetTraceResponse resp;
  grpc::Status status = stub_->GetTrace(&ctx, req, &resp);
  if (!status.ok()) return FromGrpcStatus(status);
  return resp;
}

absl::Status JobClient::FollowStream(absl::Duration reconnect_for,
                                     const std::atomic<bool>* stop,
                                     const StreamAttempt& attempt) {
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
  auto finish = [&](absl::Status result) {
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
    if (stopped()) return finish(absl::CancelledError("interrupted"));
    if (absl::Now() > give_up) {
      return finish(absl::UnavailableError(absl::StrCat(
          "cannot reach ", address_, " (tried for ",
          absl::FormatDuration(reconnect_for), "): ", last_error)));
    }
    // Wait (boundedly, and interruptibly) for a connection.
    const absl::Time wait_until =
        std::min(give_up, absl::Now() + absl::Milliseconds(200));
    if (!channel_->WaitForConnected(absl::ToChronoTime(wait_until))) continue;
    grpc::ClientContext ctx;
    Prepare(&ctx, /*deadline=*/false);
    {
      absl::MutexLock lock(&mu);
      current = &ctx;
    }
    // Anything read shows the controller is alive.
    auto alive = [&] { give_up = absl::Now() + reconnect_for; };
    std::optional<absl::Status> result = attempt(&ctx, alive, &last_error);
    {
      absl::MutexLock lock(&mu);
      current = nullptr;
    }
    if (result.has_value()) return finish(*result);
    if (stopped()) return finish(absl::CancelledError("interrupted"));
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::Status JobClient::WatchLogs(
    const std::string& job_id, bool follow,
    const std::function<void(const trainyard::v1::LogLine&)>& on_line,
    absl::Duration reconnect_for, const std::atomic<bool>* stop) {
  int64_t next_seq = 0;  // the first line not delivered yet
  return FollowStream(
      reconnect_for, stop,
      [&](grpc::ClientContext* ctx, const std::function<void()>& alive,
          std::string* error) -> std::optional<absl::Status> {
        trainyard::v1::WatchLogsRequest req;
        req.set_job_id(job_id);
        req.set_follow(follow);
        req.set_from_seq(next_seq);
        auto reader = stub_->WatchLogs(ctx, req);
        trainyard::v1::LogLine line;
        while (reader->Read(&line)) {
          alive();
          if (line.seq() < next_seq) continue;
          next_seq = line.seq() + 1;
          on_line(line);
        }
        grpc::Status status = reader->Finish();
        if (status.ok()) return absl::OkStatus();
        if (!follow || (!Transient(status) &&
                        status.error_code() != grpc::StatusCode::CANCELLED)) {
          return FromGrpcStatus(status);
        }
        *error = status.error_message();
        return std::nullopt;  // reconnect
      });
}

absl::StatusOr<JobStateChange> JobClient::Watch(
    const std::string& job_id, int64_t from_step,
    const std::function<void(const JobEvent&)>& on_event,
    absl::Duration reconnect_for, const std::atomic<bool>* stop) {
  int64_t last_step = from_step - 1;  // last step event delivered
  int64_t last_eval = from_step - 1;  // last eval event delivered
  int32_t last_recovery = 0;          // last recovery attempt delivered
  int64_t last_rows = 0;              // rows done of the last progress
  JobState last_state = trainyard::v1::JOB_STATE_UNSPECIFIED;
  std::optional<JobStateChange> terminal;
  absl::Status st = FollowStream(
      reconnect_for, stop,
      [&](grpc::ClientContext* ctx, const std::function<void()>& alive,
          std::string* error) -> std::optional<absl::Status> {
        trainyard::v1::WatchJobRequest req;
        req.set_job_id(job_id);
        // Resume at the older of the two cursors; duplicates are dropped
        // below.
        req.set_from_step(
            std::max<int64_t>(0, std::min(last_step, last_eval) + 1));
        auto reader = stub_->WatchJob(ctx, req);
        JobEvent event;
        while (reader->Read(&event)) {
          alive();
          if (event.has_step()) {
            if (event.step().step() <= last_step) continue;
            last_step = event.step().step();
          } else if (event.has_eval()) {
            if (event.eval().step() <= last_eval) continue;
            last_eval = event.eval().step();
          } else if (event.has_recovery()) {
            if (event.recovery().attempt() <= last_recovery) continue;
            last_recovery = event.recovery().attempt();
          } else if (event.has_progress()) {
            if (event.progress().rows_done() <= last_rows) continue;
            last_rows = event.progress().rows_done();
          } else if (event.has_state()) {
            if (event.state().state() == last_state) continue;
            last_state = event.state().state();
          }
          on_event(event);
          if (event.has_state() && IsTerminal(event.state().state())) {
            terminal = event.state();
            ctx->TryCancel();
            break;
          }
        }
        grpc::Status status = reader->Finish();
        if (terminal.has_value()) return absl::OkStatus();
        if (!status.ok() && !Transient(status) &&
            status.error_code() != grpc::StatusCode::CANCELLED &&
            status.error_code() != grpc::StatusCode::INTERNAL) {
          return FromGrpcStatus(status);
        }
        // The stream ended without a terminal state: reconnect.
        *error =
            status.ok() ? "the stream ended early" : status.error_message();
        return std::nullopt;
      });
  if (!st.ok()) return st;
  return *terminal;
}

std::string NewRequestId() {
  return absl::StrCat("req-", absl::BytesToHexString(RandomBytes(16)));
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
  if (spec->has_inference()) {
    MakeAbsolute(base_dir, spec->mutable_inference()->mutable_checkpoint_dir());
    MakeAbsolute(base_dir, spec->mutable_inference()->mutable_output_dir());
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
