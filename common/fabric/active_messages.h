// The fabric transport's messages (proto/ps.proto: FabricHello, FabricRequest, FabricReply) as UCX active
// messages: the header is the serialised message, the data the float32 values. Progress thread only (see
// ucx_worker.h).
#ifndef TESSERA_COMMON_FABRIC_ACTIVE_MESSAGES_H_
#define TESSERA_COMMON_FABRIC_ACTIVE_MESSAGES_H_

#include <ucp/api/ucp.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/fabric/ucx_worker.h"
#include "proto/ps.pb.h"

namespace tessera {

// Active message ids.
enum FabricMessage : unsigned {
  kFabricHello = 11,    // client -> server, the connection's first message
  kFabricRequest = 12,  // client -> server
  kFabricReply = 13,    // server -> client, to either
};

// Sends message `id` on `ep` (an endpoint of `worker`): `header`, and `length` bytes at `data` (none when null), which `keep` keeps alive
// until the send is done. `on_sent` (may be empty) runs once with the outcome: at once when the send completed
// or failed immediately, else from progress. Returns the request still in flight (for ucp_request_cancel), or
// null when on_sent already ran.
void* SendActiveMessage(UcxWorker& worker, ucp_ep_h ep, FabricMessage id, std::string header, const void* data,
                        size_t length, std::shared_ptr<const void> keep,
                        std::function<void(const absl::Status&)> on_sent);

// Receives a rendezvous message's data (`desc`, from a handler called with UCP_AM_RECV_ATTR_FLAG_RNDV) into
// `length` bytes at `dst`. `on_received` runs once, as for SendActiveMessage; the return value is the same.
void* ReceiveActiveMessageData(UcxWorker& worker, void* desc, void* dst, size_t length,
                               std::function<void(const absl::Status&)> on_received);

// A reply carrying `status` (its code and message) for request `request_id`.
tessera::v1::FabricReply ReplyWithStatus(uint64_t request_id, const absl::Status& status);
// The status a reply carries, its message prefixed with `what`.
absl::Status StatusOfReply(const tessera::v1::FabricReply& reply, std::string_view what);

}  // namespace tessera

#endif  // TESSERA_COMMON_FABRIC_ACTIVE_MESSAGES_H_
