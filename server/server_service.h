// The gRPC adapter of a parameter server: converts messages and statuses, and nothing else.
//
// The data plane (Pull, Push, PushPull) is served on gRPC's callback API with raw byte buffers: a request's
// values are copied once, from gRPC's slices into the store (see common/wire_payload.h), and a reply's values
// go from a pooled buffer to the socket. Large pushes are applied on an update pool, so the gRPC thread goes
// back to reading the network while the update rule runs. A PushPull of an open SYNC round holds its reply until the round
// closes, without holding a thread. Checkpoint files are written, and read for a restore, on a thread of
// their own.
#ifndef TESSERA_SERVER_SERVER_SERVICE_H_
#define TESSERA_SERVER_SERVER_SERVICE_H_

#include <functional>

#include "common/thread_pool.h"
#include "proto/ps.grpc.pb.h"
#include "server/shard_store.h"

namespace tessera {

using ParameterServerBase = tessera::v1::ParameterServer::WithRawCallbackMethod_Pull<
    tessera::v1::ParameterServer::WithRawCallbackMethod_Push<
        tessera::v1::ParameterServer::WithRawCallbackMethod_PushPull<tessera::v1::ParameterServer::CallbackService>>>;

// Thread-safe.
class ServerService final : public ParameterServerBase {
 public:
  // `store` and `updates` are not owned and must outlive the service. Pushes of at least `inline_update_bytes`
  // are applied on `updates`, smaller ones on the gRPC thread. `on_shutdown` runs (on an RPC thread, so it must
  // not block) when the scheduler asks the server to exit.
  ServerService(ShardStore* store, ThreadPool* updates, size_t inline_update_bytes, std::function<void()> on_shutdown)
      : store_(store),
        updates_(updates),
        inline_update_bytes_(inline_update_bytes),
        on_shutdown_(std::move(on_shutdown)) {}

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* AssignShards(grpc::CallbackServerContext* context,
                                         const tessera::v1::AssignShardsRequest* request,
                                         tessera::v1::AssignShardsResponse* response) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const tessera::v1::CheckpointRequest* request,
                                       tessera::v1::CheckpointResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const tessera::v1::ServerStatsRequest* request,
                                     tessera::v1::ServerStats* response) override;
  grpc::ServerUnaryReactor* DecideRounds(grpc::CallbackServerContext* context,
                                         const tessera::v1::DecideRoundsRequest* request,
                                         tessera::v1::DecideRoundsResponse* response) override;
  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* context,
                                     const tessera::v1::ShutdownRequest* request,
                                     tessera::v1::ShutdownResponse* response) override;

 private:
  // Runs `apply` on the update pool when the push carries at least inline_update_bytes_, else here.
  void RunUpdate(size_t bytes, std::function<void()> apply);

  ShardStore* const store_;
  ThreadPool* const updates_;
  const size_t inline_update_bytes_;
  const std::function<void()> on_shutdown_;
  // Last member: checkpoint work still queued finishes before the rest goes.
  SerialExecutor files_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVER_SERVICE_H_
