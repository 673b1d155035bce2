// The one boundary between absl::Status (all core logic) and grpc::Status (services and stubs).
//
// Payloads travel as trailing metadata: a server's current shard-map epoch, attached to FAILED_PRECONDITION by
// the core, reaches the client library as the same payload.
#ifndef TESSERA_COMMON_RPC_GRPC_STATUS_H_
#define TESSERA_COMMON_RPC_GRPC_STATUS_H_

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace tessera {

// Converts a core status for a reply; copies known payloads into `context`'s trailing metadata.
grpc::Status ToGrpcStatus(const absl::Status& status, grpc::ServerContextBase* context);

// Converts a call's status back; restores payloads from `context`'s trailing metadata. `what` names the call
// and peer ("Push w1/0 to 127.0.0.1:4100") and prefixes the message of any error.
absl::Status FromGrpcStatus(const grpc::Status& status, const grpc::ClientContext& context, std::string_view what);
// The same for a call this process did not cancel (`cancelled_here` false): a CANCELLED then means the server
// ended the call (a drained or stopping server shuts down with calls in flight), reported as a lost connection
// (UNAVAILABLE), which callers retry where the view says.
absl::Status FromGrpcCallStatus(const grpc::Status& status, const grpc::ClientContext& context, std::string_view what,
                                bool cancelled_here);

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_GRPC_STATUS_H_
