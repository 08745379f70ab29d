// JobService requests whose bytes do not parse, sent as raw bytes to a
// controller over real gRPC on 127.0.0.1: they are refused with
// INVALID_ARGUMENT saying why (after authentication), and valid requests
// are served as before.
#include <memory>
#include <string>
#include <vector>

#include "controller/controller_test_fixture.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "gtest/gtest.h"
#include "security/tokens.h"

namespace trainyard {
namespace controller_test {
namespace {

using ::testing::HasSubstr;

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// A SubmitJobRequest ("deep<depth>") for a valid one-stage job whose
// spec.task.config is a Struct nested `depth` levels deep ({"a": {"a": ...}}).
std::string NestedSubmitBytes(int depth) {
  v1::SubmitJobRequest request;
  request.set_request_id(absl::StrCat("deep", depth));
  *request.mutable_spec() = Spec(1);
  google::protobuf::Struct* s =
      request.mutable_spec()->mutable_task()->mutable_config();
  for (int i = 1; i < depth; ++i) {
    s = (*s->mutable_fields())["a"].mutable_struct_value();
  }
  (*s->mutable_fields())["leaf"].set_number_value(1);
  // Protobuf serializes what it cannot parse back: serialization has no
  // recursion limit.
  std::string bytes;
  EXPECT_TRUE(request.SerializeToString(&bytes));
  return bytes;
}

// A SubmitJobRequest cut off in the middle of its spec.
std::string TruncatedSubmitBytes() {
  v1::SubmitJobRequest request;
  request.set_request_id("cut");
  *request.mutable_spec() = Spec(1);
  std::string bytes = request.SerializeAsString();
  return bytes.substr(0, bytes.size() - 3);
}

class RequestParsingTest : public ControllerTest {
 protected:
  grpc::Status Unary(const std::string& method, const std::string& bytes,
                     std::string* reply = nullptr,
                     const std::string& token = "") {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    grpc::ByteBuffer response;
    grpc::Status st =
        grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
            channel_.get(),
            grpc::internal::RpcMethod(
                ("/trainyard.v1.JobService/" + method).c_str(),
                grpc::internal::RpcMethod::NORMAL_RPC),
            &ctx, Bytes(bytes), &response);
    if (reply != nullptr && st.ok()) *reply = Flatten(response);
    return st;
  }
  // WatchJob with raw request bytes: its status and how many events came.
  grpc::Status Watch(const std::string& bytes, int* events) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    grpc::internal::RpcMethod method(
        "/trainyard.v1.JobService/WatchJob",
        grpc::internal::RpcMethod::SERVER_STREAMING);
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
            channel_.get(), method, &ctx, Bytes(bytes)));
    grpc::ByteBuffer event;
    *events = 0;
    while (reader->Read(&event)) ++*events;
    return reader->Finish();
  }
};

TEST_F(RequestParsingTest, NestingPastTheRecursionLimitIsInvalidArgument) {
  const std::string bytes = NestedSubmitBytes(150);
  v1::SubmitJobRequest check;
  ASSERT_FALSE(check.ParseFromString(bytes));  // the limit applies here too

  grpc::Status st = Unary("SubmitJob", bytes);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(),
            "SubmitJob: the request is not a valid "
            "trainyard.v1.SubmitJobRequest: nested deeper than protobuf's "
            "recursion limit (100)");

  // Each level of config is three messages (Struct, its map entry, Value)
  // below SubmitJobRequest, JobSpec and TaskSpec: 32 levels parse (and meet
  // the spec's own limit), 33 do not.
  st = Unary("SubmitJob", NestedSubmitBytes(32));
  EXPECT_THAT(st.error_message(), HasSubstr("nested 32 levels deep, limit 16"));
  st = Unary("SubmitJob", NestedSubmitBytes(33));
  EXPECT_THAT(st.error_message(), HasSubstr("recursion limit (100)"));

  v1::ListJobsRequest list;
  grpc::ClientContext ctx;
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(jobs_->ListJobs(&ctx, list, &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0);
}

TEST_F(RequestParsingTest, MalformedBytesAreInvalidArgument) {
  const std::string truncated = TruncatedSubmitBytes();
  grpc::Status st = Unary("SubmitJob", truncated);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(),
            absl::StrCat("SubmitJob: the request is not a valid "
                         "trainyard.v1.SubmitJobRequest: malformed protobuf (",
                         truncated.size(), " bytes)"));

  // Field 1 (job_id), length-delimited, claiming 100 bytes of 2.
  st = Unary("GetJob", std::string("\x0a\x64xy", 4));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(),
            "GetJob: the request is not a valid trainyard.v1.GetJobRequest: "
            "malformed protobuf (4 bytes)");

  // A job_id that is not UTF-8: proto3 strings must be.
  st = Unary("CancelJob", std::string("\x0a\x02\xff\xfe", 4));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(),
              HasSubstr("CancelJob: the request is not a valid "
                        "trainyard.v1.CancelJobRequest: malformed protobuf"));

  int events = -1;
  st = Watch(std::string("\x0a\x64xy", 4), &events);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(),
            "WatchJob: the request is not a valid "
            "trainyard.v1.WatchJobRequest: malformed protobuf (4 bytes)");
  EXPECT_EQ(events, 0);
}

TEST_F(RequestParsingTest, ValidRawRequestsAreServedAsBefore) {
  const std::string bytes = NestedSubmitBytes(5);
  std::string reply;
  grpc::Status st = Unary("SubmitJob", bytes, &reply);
  ASSERT_TRUE(st.ok()) << st.error_message();
  v1::Job job;
  ASSERT_TRUE(job.ParseFromString(reply));
  EXPECT_FALSE(job.job_id().empty());
  EXPECT_EQ(job.request_id(), "deep5");
  EXPECT_EQ(Get(job.job_id()).spec().SerializeAsString(),
            job.spec().SerializeAsString());

  // Errors of the services themselves are unchanged: a config that parses
  // but is nested past the spec's own limit.
  st = Unary("SubmitJob", NestedSubmitBytes(20));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(),
              HasSubstr("task.config: nested 20 levels deep, limit 16"));
  v1::GetJobRequest get;
  get.set_job_id("no-such-job");
  st = Unary("GetJob", get.SerializeAsString());
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);

  v1::WatchJobRequest watch;
  watch.set_job_id(job.job_id());
  watch.set_from_step(-1);
  int events = -1;
  st = Watch(watch.SerializeAsString(), &events);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("from_step: must be >= 0"));
}

TEST_F(RequestParsingTest, AuthenticationIsCheckedBeforeParsing) {
  const std::string tokens = dir_ + "/tokens";
  const std::string alice = NewToken();
  ASSERT_TRUE(AppendToken(tokens, "alice", Role::kUser, alice).ok());
  server_.reset();
  StartServer(absl::Seconds(10), tokens);
  const std::string deep = NestedSubmitBytes(150);

  EXPECT_EQ(Unary("SubmitJob", deep).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Unary("SubmitJob", deep, nullptr, "not-a-token").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  int events = -1;
  EXPECT_EQ(Watch("\x0a\x64xy", &events).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  grpc::Status st = Unary("SubmitJob", deep, nullptr, alice);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("recursion limit (100)"));
}

// WorkerService.Connect: a message that does not parse ends the stream with
// INVALID_ARGUMENT (it is not taken for the worker's half-close), and a
// registered worker is lost with that reason.
TEST_F(RequestParsingTest, MalformedWorkerMessageEndsTheStream) {
  grpc::internal::RpcMethod connect("/trainyard.v1.WorkerService/Connect",
                                    grpc::internal::RpcMethod::BIDI_STREAMING);
  const std::string malformed("\x0a\x64xy", 4);
  {
    grpc::ClientContext ctx;
    std::unique_ptr<
        grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
        stream(grpc::internal::ClientReaderWriterFactory<
               grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel_.get(),
                                                           connect, &ctx));
    stream->Write(Bytes(malformed));
    grpc::ByteBuffer reply;
    EXPECT_FALSE(stream->Read(&reply));
    grpc::Status st = stream->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(),
                HasSubstr(": a message on its stream is not a valid "
                          "trainyard.v1.WorkerMessage: malformed protobuf (4 "
                          "bytes)"));
  }
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
      stream(grpc::internal::ClientReaderWriterFactory<
             grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel_.get(),
                                                         connect, &ctx));
  v1::WorkerMessage reg;
  reg.mutable_register_()->set_name("raw");
  reg.mutable_register_()->mutable_capabilities()->set_device("cpu");
  reg.mutable_register_()->mutable_capabilities()->set_peer_address(
      "raw.peer:9000");
  ASSERT_TRUE(stream->Write(Bytes(reg.SerializeAsString())));
  grpc::ByteBuffer reply;
  ASSERT_TRUE(stream->Read(&reply));
  v1::ControllerMessage registered;
  ASSERT_TRUE(registered.ParseFromString(Flatten(reply)));
  ASSERT_TRUE(registered.has_registered());
  EXPECT_EQ(server_->manager()->ListWorkers().size(), 1u);

  stream->Write(Bytes(malformed));
  while (stream->Read(&reply)) {
  }
  grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("malformed protobuf (4 bytes)"));
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!server_->manager()->ListWorkers().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(server_->manager()->ListWorkers().empty());
}

}  // namespace
}  // namespace controller_test
}  // namespace trainyard
