// Request parsing at the controller's RPC edge: a callback method whose
// request bytes do not parse is answered INVALID_ARGUMENT saying why,
// instead of gRPC's own answer (UNIMPLEMENTED with an empty message, which
// its callback handlers give whenever deserialization fails).
//
// How: the method is registered with gRPC's callback handler over
// ParsedRequest<Req> instead of Req. Its SerializationTraits (below; they
// apply to this wrapper only, not to any message type) always succeed and
// record whether the bytes parsed, so the handler always runs; the adapter
// made by ParsingUnaryHandler / ParsingServerStreamHandler then refuses the
// call or hands &parsed.message to the service's typed method unchanged.
// Responses are serialized by gRPC exactly as before. A bidi stream's
// reactor may read ParsedRequest<Req> messages itself (WorkerService.Connect
// does) and end the stream when one does not parse.
//
// Which error wins: authentication first. A request that does not parse is
// refused with the authentication error when `authenticate` fails (as every
// request is), and INVALID_ARGUMENT otherwise; nothing in an unparsed
// request can be authorized, so it never reaches the service's method.
//
// Usage, in the constructor of a class derived from Foo::CallbackService:
//   MarkMethodCallback(
//       MethodIndex("pkg.Foo", "Bar", *BarRequest::descriptor()),
//       ParsingHandler("Bar", authenticate, this, &FooImpl::Bar));
#ifndef TRAINYARD_CONTROLLER_REQUEST_PARSING_H_
#define TRAINYARD_CONTROLLER_REQUEST_PARSING_H_

#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/server_callback_handlers.h"
#include "grpcpp/impl/serialization_traits.h"
#include "grpcpp/support/byte_buffer.h"

namespace trainyard {

// The recursion limit requests are parsed with: protobuf's default, the
// one gRPC's own deserialization uses.
inline constexpr int kRequestRecursionLimit = 100;

// Why `bytes` do not parse as `message` (whose contents are then
// unspecified): OK when they do, else InvalidArgument "nested deeper than
// protobuf's recursion limit (100)", "malformed protobuf (N bytes)" or "no
// request message" (bytes == nullptr). A message nested too deep is told
// from a malformed one by parsing again with a limit 10 times higher; one
// nested deeper than that too is reported as malformed. Leaves `bytes`
// as it was.
absl::Status ParseRequestBytes(grpc::ByteBuffer* bytes,
                               google::protobuf::Message* message);

// A request as the server read it: the message, or why it did not parse.
template <typename Req>
struct ParsedRequest {
  Req message;
  absl::Status status;  // from ParseRequestBytes
};

// The refusal of a request that did not parse: `auth` when it is an error,
// else INVALID_ARGUMENT "<method>: the request is not a valid <type>:
// <why>" (at most a few hundred bytes: the names are the service's own).
grpc::Status UnparsedRequestStatus(absl::string_view method,
                                   const google::protobuf::Descriptor& type,
                                   const absl::Status& parse_status,
                                   const grpc::Status& auth);

// The index gRPC's generated code gives `method` of `service` (a full name,
// e.g. "trainyard.v1.JobService"): its index in the service's descriptor.
// CHECK-fails when there is no such method or its request is not
// `request_type`.
int MethodIndex(absl::string_view service, absl::string_view method,
                const google::protobuf::Descriptor& request_type);

// A server stream that only reports `status`.
template <typename T>
class FailedStream final : public grpc::ServerWriteReactor<T> {
 public:
  explicit FailedStream(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

// Authenticates the caller of a request that did not parse: OK, or the
// status the caller is refused with.
using AuthenticateFn =
    std::function<grpc::Status(grpc::CallbackServerContext*)>;

// The handler of a unary method of request Req: runs `typed` on a request
// that parsed, refuses one that did not (see UnparsedRequestStatus).
template <typename Req, typename Resp>
grpc::internal::MethodHandler* ParsingUnaryHandler(
    std::string method, AuthenticateFn authenticate,
    std::function<grpc::ServerUnaryReactor*(grpc::CallbackServerContext*,
                                            const Req*, Resp*)>
        typed) {
  return new grpc::internal::CallbackUnaryHandler<ParsedRequest<Req>, Resp>(
      [method = std::move(method), authenticate = std::move(authenticate),
       typed = std::move(typed)](grpc::CallbackServerContext* context,
                                 const ParsedRequest<Req>* request,
                                 Resp* response) {
        if (request->status.ok()) {
          return typed(context, &request->message, response);
        }
        grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
        reactor->Finish(UnparsedRequestStatus(method, *Req::descriptor(),
                                              request->status,
                                              authenticate(context)));
        return reactor;
      });
}

// The same for a server-streaming method writing Resp.
template <typename Req, typename Resp>
grpc::internal::MethodHandler* ParsingServerStreamHandler(
    std::string method, AuthenticateFn authenticate,
    std::function<grpc::ServerWriteReactor<Resp>*(grpc::CallbackServerContext*,
                                                  const Req*)>
        typed) {
  return new grpc::internal::CallbackServerStreamingHandler<ParsedRequest<Req>,
                                                            Resp>(
      [method = std::move(method), authenticate = std::move(authenticate),
       typed = std::move(typed)](grpc::CallbackServerContext* context,
                                 const ParsedRequest<Req>* request)
          -> grpc::ServerWriteReactor<Resp>* {
        if (request->status.ok()) return typed(context, &request->message);
        return new FailedStream<Resp>(
            UnparsedRequestStatus(method, *Req::descriptor(), request->status,
                                  authenticate(context)));
      });
}

// The handler of `method` of `service`, a unary or server-streaming member
// function of a CallbackService: ParsingUnaryHandler or
// ParsingServerStreamHandler over it.
template <typename Service, typename Req, typename Resp>
grpc::internal::MethodHandler* ParsingHandler(
    std::string method, AuthenticateFn authenticate, Service* service,
    grpc::ServerUnaryReactor* (Service::*typed)(grpc::CallbackServerContext*,
                                                const Req*, Resp*)) {
  return ParsingUnaryHandler<Req, Resp>(
      std::move(method), std::move(authenticate),
      [service, typed](grpc::CallbackServerContext* context, const Req* request,
                       Resp* response) {
        return (service->*typed)(context, request, response);
      });
}
template <typename Service, typename Req, typename Resp>
grpc::internal::MethodHandler* ParsingHandler(
    std::string method, AuthenticateFn authenticate, Service* service,
    grpc::ServerWriteReactor<Resp>* (Service::*typed)(
        grpc::CallbackServerContext*, const Req*)) {
  return ParsingServerStreamHandler<Req, Resp>(
      std::move(method), std::move(authenticate),
      [service, typed](grpc::CallbackServerContext* context,
                       const Req* request) {
        return (service->*typed)(context, request);
      });
}

// RequestOf<decltype(&Service::Method)>::Type: the method's request type.
template <typename MemberFn>
struct RequestOf;
template <typename Service, typename Req, typename Resp>
struct RequestOf<grpc::ServerUnaryReactor* (
    Service::*)(grpc::CallbackServerContext*, const Req*, Resp*)> {
  using Type = Req;
};
template <typename Service, typename Req, typename Resp>
struct RequestOf<grpc::ServerWriteReactor<Resp>* (
    Service::*)(grpc::CallbackServerContext*, const Req*)> {
  using Type = Req;
};

}  // namespace trainyard

namespace grpc {

// Deserialization of a ParsedRequest never fails: it records the outcome
// (see trainyard::ParseRequestBytes). Requests only; never serialized.
template <typename Req>
class SerializationTraits<trainyard::ParsedRequest<Req>, void> {
 public:
  static Status Deserialize(ByteBuffer* buffer,
                            trainyard::ParsedRequest<Req>* request) {
    request->status = trainyard::ParseRequestBytes(buffer, &request->message);
    if (buffer != nullptr) buffer->Clear();
    return Status::OK;
  }
};

}  // namespace grpc

#endif  // TRAINYARD_CONTROLLER_REQUEST_PARSING_H_
