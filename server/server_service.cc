#include "server/server_service.h"

#include "common/grpc_status.h"

namespace tessera {

template <typename T>
static grpc::Status Reply(absl::StatusOr<T> result, T* response, grpc::ServerContext* context) {
  if (!result.ok()) return ToGrpcStatus(result.status(), context);
  *response = std::move(result).value();
  return grpc::Status::OK;
}

grpc::Status ServerService::Pull(grpc::ServerContext* context, const tessera::v1::PullRequest* request,
                                 tessera::v1::PullResponse* response) {
  return Reply(store_->Pull(*request), response, context);
}

grpc::Status ServerService::Push(grpc::ServerContext* context, const tessera::v1::PushRequest* request,
                                 tessera::v1::PushResponse* response) {
  return Reply(store_->Push(*request), response, context);
}

grpc::Status ServerService::AssignShards(grpc::ServerContext* context, const tessera::v1::AssignShardsRequest* request,
                                         tessera::v1::AssignShardsResponse*) {
  return ToGrpcStatus(store_->Assign(request->shard_map(), request->job(), request->server_id()), context);
}

grpc::Status ServerService::GetStats(grpc::ServerContext*, const tessera::v1::ServerStatsRequest*,
                                     tessera::v1::ServerStats* response) {
  *response = store_->Stats();
  return grpc::Status::OK;
}

grpc::Status ServerService::Shutdown(grpc::ServerContext*, const tessera::v1::ShutdownRequest*,
                                     tessera::v1::ShutdownResponse*) {
  on_shutdown_();
  return grpc::Status::OK;
}

}  // namespace tessera
