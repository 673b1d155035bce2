// The gRPC adapter of a parameter server: converts messages and statuses, and nothing else.
//
// The data plane (Pull, Push, PushPull) is served on gRPC's callback API with raw byte buffers: a request's
// values are copied once, from gRPC's slices into the store (see common/rpc/wire_payload.h), and a reply's values
// go from a pooled buffer to the socket. Large pushes are applied on an update pool, so the gRPC thread goes
// back to reading the network while the update rule runs. A PushPull of an open SYNC round holds its reply until the round
// closes, without holding a thread. Checkpoint files are written, and read for a restore, on a thread of
// their own.
#ifndef TESSERA_SERVER_SERVER_SERVICE_H_
#define TESSERA_SERVER_SERVER_SERVICE_H_

#include <functional>

#include "common/rpc/security.h"
#include "common/base/thread_pool.h"
#include "proto/ps.grpc.pb.h"
#include "server/request_conversions.h"
#include "server/shard_store.h"

namespace tessera {

// Every method takes its request as bytes: the store parses pushes without copying their values, and every
// method answers a missing token or an unparsable request the same way (common/rpc/rpc_handler.h).
using ParameterServerBase = tessera::v1::ParameterServer::WithRawCallbackMethod_Pull<
    tessera::v1::ParameterServer::WithRawCallbackMethod_Push<
    tessera::v1::ParameterServer::WithRawCallbackMethod_PushPull<
    tessera::v1::ParameterServer::WithRawCallbackMethod_AssignShards<
    tessera::v1::ParameterServer::WithRawCallbackMethod_Checkpoint<
    tessera::v1::ParameterServer::WithRawCallbackMethod_GetStats<
    tessera::v1::ParameterServer::WithRawCallbackMethod_DecideRounds<
    tessera::v1::ParameterServer::WithRawCallbackMethod_Shutdown<
    tessera::v1::ParameterServer::WithRawCallbackMethod_Replicate<
    tessera::v1::ParameterServer::WithRawCallbackMethod_PullRows<
    tessera::v1::ParameterServer::WithRawCallbackMethod_PushRows<
        tessera::v1::ParameterServer::CallbackService>>>>>>>>>>>;

// A pull of rows as its gRPC reply (found by ServeUnary): a RowPullResponse whose values go from the store's buffer
// to the wire as they are.
void WriteResponse(const PulledRows& rows, grpc::ByteBuffer* out);

class ServerService final : public ParameterServerBase {
 public:
  // `store` and `updates` are not owned and must outlive the service. Pushes of at least `inline_update_bytes`
  // are applied on `updates`, smaller ones on the gRPC thread. `on_shutdown` runs (on an RPC thread, so it must
  // not block) when the scheduler asks the server to exit. Every call needs `security`'s job token; the control
  // methods (AssignShards, Checkpoint, DecideRounds, Shutdown) also `control_key`, which only the scheduler has.
  ServerService(ShardStore* store, ThreadPool* updates, size_t inline_update_bytes, std::function<void()> on_shutdown,
                std::shared_ptr<const Security> security, std::string control_key)
      : store_(store),
        updates_(updates),
        inline_update_bytes_(inline_update_bytes),
        on_shutdown_(std::move(on_shutdown)),
        security_(std::move(security)),
        control_key_(std::move(control_key)) {}

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* AssignShards(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DecideRounds(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  // From another server of the job (its member key is checked by the store).
  grpc::ServerUnaryReactor* Replicate(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  // Embedding tables' rows (ShardStore::PullRows, PushRows); a push's update runs on `updates` when it is large.
  grpc::ServerUnaryReactor* PullRows(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PushRows(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;

 private:
  // OK when the call carries the scheduler's control key.
  absl::Status CheckControlKey(const grpc::CallbackServerContext& context) const;

  ShardStore* const store_;
  ThreadPool* const updates_;
  const size_t inline_update_bytes_;
  const std::function<void()> on_shutdown_;
  const std::shared_ptr<const Security> security_;
  const std::string control_key_;
  // Last member: checkpoint work still queued finishes before the rest goes.
  SerialExecutor files_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVER_SERVICE_H_
