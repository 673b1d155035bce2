// The gRPC adapter of a parameter server: converts messages and statuses, and nothing else.
#ifndef TESSERA_SERVER_SERVER_SERVICE_H_
#define TESSERA_SERVER_SERVER_SERVICE_H_

#include <functional>

#include "proto/ps.grpc.pb.h"
#include "server/shard_store.h"

namespace tessera {

// Thread-safe.
class ServerService final : public tessera::v1::ParameterServer::Service {
 public:
  // `store` is not owned and must outlive the service. `on_shutdown` runs (on an RPC thread, so it must not
  // block) when the scheduler asks the server to exit.
  ServerService(ShardStore* store, std::function<void()> on_shutdown)
      : store_(store), on_shutdown_(std::move(on_shutdown)) {}

  grpc::Status Pull(grpc::ServerContext* context, const tessera::v1::PullRequest* request,
                    tessera::v1::PullResponse* response) override;
  grpc::Status Push(grpc::ServerContext* context, const tessera::v1::PushRequest* request,
                    tessera::v1::PushResponse* response) override;
  grpc::Status AssignShards(grpc::ServerContext* context, const tessera::v1::AssignShardsRequest* request,
                            tessera::v1::AssignShardsResponse* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const tessera::v1::ServerStatsRequest* request,
                        tessera::v1::ServerStats* response) override;
  grpc::Status Shutdown(grpc::ServerContext* context, const tessera::v1::ShutdownRequest* request,
                        tessera::v1::ShutdownResponse* response) override;

 private:
  ShardStore* const store_;
  const std::function<void()> on_shutdown_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVER_SERVICE_H_
