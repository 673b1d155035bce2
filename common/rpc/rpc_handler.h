// Serving a unary method whose request arrives as bytes (gRPC's raw callback methods), so that Tessera's
// endpoints answer the same way to what they cannot take: a call without the job token is UNAUTHENTICATED, and
// bytes that are not the request message, or an enum value the proto does not define, are INVALID_ARGUMENT
// naming the message type or field, before any handler runs. Every method of the scheduler and the servers'
// AssignShards, Checkpoint, GetStats, DecideRounds, Replicate and Shutdown go through ServeUnary; the servers' data-plane
// methods (Pull, Push, PushPull) parse their values without a copy, so they make the same token and parse checks
// themselves (Security::Authenticate, ParseWithPayload; a push's kind is checked by ToChunkPush), in
// server/server_service.cc.
//
//   grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* c, const grpc::ByteBuffer* in,
//                                       grpc::ByteBuffer* out) override {
//     return ServeUnary<HeartbeatRequest, HeartbeatResponse>(c, in, out, *security_,
//         [this](const auto& request, auto reply) { reply(coordinator_->Heartbeat(*request)); });
//   }
#ifndef TESSERA_COMMON_RPC_RPC_HANDLER_H_
#define TESSERA_COMMON_RPC_RPC_HANDLER_H_

#include <functional>
#include <memory>

#include <grpc/slice.h>
#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/security.h"
#include "common/model/wire_limits.h"
#include "common/rpc/wire_payload.h"

namespace tessera {

// In a ServeUnary handler: replies with `expr`'s error and returns when it is one.
#define TESSERA_REPLY_IF_ERROR(reply, expr)          \
  do {                                               \
    if (absl::Status tessera_reply_status_ = (expr); \
        !tessera_reply_status_.ok()) {               \
      (reply)(std::move(tessera_reply_status_));     \
      return;                                        \
    }                                                \
  } while (false)

// A response message as gRPC's reply, serialised once, straight into gRPC's own buffer. A handler whose answer is
// not a message (values in a pooled buffer) gives ServeUnary an overload of its own for it, found by its type.
inline void WriteResponse(const google::protobuf::MessageLite& response, grpc::ByteBuffer* out) {
  const size_t bytes = response.ByteSizeLong();
  grpc_slice slice = grpc_slice_malloc(bytes);
  response.SerializeWithCachedSizesToArray(GRPC_SLICE_START_PTR(slice));
  grpc::Slice owned(slice, grpc::Slice::STEAL_REF);
  *out = grpc::ByteBuffer(&owned, 1);
}

// Finishes a call once; safe from any thread.
template <typename Response>
using UnaryReply = std::function<void(absl::StatusOr<Response>)>;

// Authenticates and parses the call, then runs `handle(std::shared_ptr<const Request>, UnaryReply<Response>)`.
// The reply may come later, from any thread; it serialises the response into `out` and finishes the call.
template <typename Request, typename Response, typename Handle>
grpc::ServerUnaryReactor* ServeUnary(grpc::CallbackServerContext* context, const grpc::ByteBuffer* in,
                                     grpc::ByteBuffer* out, const Security& security, Handle&& handle) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto request = std::make_shared<Request>();
  absl::Status accepted = security.Authenticate(*context);
  if (accepted.ok()) {
    ReceivedPayload none;
    accepted = ParseWithPayload(*in, /*field_number=*/0, request.get(), &none);
  }
  if (accepted.ok()) accepted = CheckKnownEnums(*request);
  if (!accepted.ok()) {
    reactor->Finish(ToGrpcStatus(accepted, context));
    return reactor;
  }
  handle(std::shared_ptr<const Request>(std::move(request)),
         UnaryReply<Response>([context, reactor, out](absl::StatusOr<Response> response) {
           if (response.ok()) WriteResponse(*response, out);
           reactor->Finish(ToGrpcStatus(response.status(), context));
         }));
  return reactor;
}

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_RPC_HANDLER_H_
