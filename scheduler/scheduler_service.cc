#include "scheduler/scheduler_service.h"

#include "common/grpc_status.h"

namespace tessera {
namespace {

// Finishes `context`'s default reactor with `result`, copying the value into `response` on success.
template <typename T>
grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context, absl::StatusOr<T> result, T* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (result.ok()) *response = std::move(result).value();
  reactor->Finish(ToGrpcStatus(result.status(), context));
  return reactor;
}

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status, context));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* SchedulerService::Register(grpc::CallbackServerContext* context,
                                                     const tessera::v1::RegisterRequest* request,
                                                     tessera::v1::RegisterResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  coordinator_->Register(*request, [context, reactor, response](absl::StatusOr<tessera::v1::RegisterResponse> r) {
    if (r.ok()) *response = std::move(r).value();
    reactor->Finish(ToGrpcStatus(r.status(), context));
  });
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::Heartbeat(grpc::CallbackServerContext* context,
                                                      const tessera::v1::HeartbeatRequest* request,
                                                      tessera::v1::HeartbeatResponse* response) {
  return FinishWith(context, coordinator_->Heartbeat(*request), response);
}

grpc::ServerUnaryReactor* SchedulerService::Declare(grpc::CallbackServerContext* context,
                                                    const tessera::v1::DeclareRequest* request,
                                                    tessera::v1::DeclareResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  coordinator_->Declare(*request, [context, reactor, response](absl::StatusOr<tessera::v1::ShardMap> map) {
    if (map.ok()) *response->mutable_shard_map() = std::move(map).value();
    reactor->Finish(ToGrpcStatus(map.status(), context));
  });
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::GetShardMap(grpc::CallbackServerContext* context,
                                                        const tessera::v1::GetShardMapRequest*,
                                                        tessera::v1::ShardMap* response) {
  return FinishWith(context, coordinator_->GetShardMap(), response);
}

grpc::ServerUnaryReactor* SchedulerService::AdvanceClock(grpc::CallbackServerContext* context,
                                                         const tessera::v1::AdvanceClockRequest* request,
                                                         tessera::v1::AdvanceClockResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  coordinator_->AdvanceClock(
      *request, [context, reactor, response](absl::StatusOr<tessera::v1::AdvanceClockResponse> answer) {
        if (answer.ok()) *response = std::move(*answer);
        reactor->Finish(ToGrpcStatus(answer.status(), context));
      });
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::Report(grpc::CallbackServerContext* context,
                                                   const tessera::v1::ReportRequest* request,
                                                   tessera::v1::ReportResponse* response) {
  return FinishWith(context, coordinator_->Report(*request), response);
}

grpc::ServerUnaryReactor* SchedulerService::Done(grpc::CallbackServerContext* context,
                                                 const tessera::v1::DoneRequest* request, tessera::v1::DoneResponse*) {
  return FinishWith(context, coordinator_->Done(*request));
}

}  // namespace tessera
