#include "controller/request_parsing.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace trainyard {
namespace {

// Whether `bytes` parse as `message` with `recursion_limit`.
bool ParsesWithLimit(grpc::ByteBuffer* bytes,
                     google::protobuf::Message* message, int recursion_limit) {
  grpc::ProtoBufferReader reader(bytes);
  if (!reader.status().ok()) return false;
  google::protobuf::io::CodedInputStream in(&reader);
  in.SetRecursionLimit(recursion_limit);
  return message->ParseFromCodedStream(&in) && in.ConsumedEntireMessage();
}

}  // namespace

absl::Status ParseRequestBytes(grpc::ByteBuffer* bytes,
                               google::protobuf::Message* message) {
  if (bytes == nullptr) {
    return absl::InvalidArgumentError("no request message");
  }
  if (ParsesWithLimit(bytes, message, kRequestRecursionLimit)) {
    return absl::OkStatus();
  }
  // Bounded, so that a hostile message cannot take the parser's stack.
  std::unique_ptr<google::protobuf::Message> deeper(message->New());
  if (ParsesWithLimit(bytes, deeper.get(), 10 * kRequestRecursionLimit)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nested deeper than protobuf's recursion limit (",
                     kRequestRecursionLimit, ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("malformed protobuf (", bytes->Length(), " bytes)"));
}

grpc::Status UnparsedRequestStatus(absl::string_view method,
                                   const google::protobuf::Descriptor& type,
                                   const absl::Status& parse_status,
                                   const grpc::Status& auth) {
  if (!auth.ok()) return auth;
  return grpc::Status(
      grpc::StatusCode::INVALID_ARGUMENT,
      absl::StrCat(method, ": the request is not a valid ", type.full_name(),
                   ": ", parse_status.message()));
}

int MethodIndex(absl::string_view service, absl::string_view method,
                const google::protobuf::Descriptor& request_type) {
  const google::protobuf::ServiceDescriptor* s =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          std::string(service));
  CHECK(s != nullptr) << "no service " << service;
  const google::protobuf::MethodDescriptor* m =
      s->FindMethodByName(std::string(method));
  CHECK(m != nullptr) << "no method " << service << "." << method;
  CHECK(m->input_type() == &request_type)
      << service << "." << method << " takes " << m->input_type()->full_name()
      << ", not " << request_type.full_name();
  return m->index();
}

}  // namespace trainyard
