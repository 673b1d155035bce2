#include "scheduler/scheduler_service.h"

#include "common/rpc/rpc_handler.h"

namespace tessera {

using tessera::v1::AdvanceClockRequest;
using tessera::v1::AdvanceClockResponse;
using tessera::v1::DeclareRequest;
using tessera::v1::DeclareResponse;
using tessera::v1::DoneRequest;
using tessera::v1::DoneResponse;
using tessera::v1::GetShardMapRequest;
using tessera::v1::HeartbeatRequest;
using tessera::v1::HeartbeatResponse;
using tessera::v1::RegisterRequest;
using tessera::v1::RegisterResponse;
using tessera::v1::ReportRequest;
using tessera::v1::ReportResponse;
using tessera::v1::ShardMap;

absl::Status SchedulerService::CheckMember(const grpc::CallbackServerContext& context, tessera::v1::Role role,
                                           int id) const {
  return coordinator_->view().CheckMemberKey(role, id, ClientMetadata(context, kMemberKeyHeader));
}

grpc::ServerUnaryReactor* SchedulerService::Register(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  return ServeUnary<RegisterRequest, RegisterResponse>(
      context, request, response, *security_,
      [this, context](std::shared_ptr<const RegisterRequest> r, UnaryReply<RegisterResponse> reply) {
        // A member coming back to a restarted scheduler proves who it is with the key it was given.
        coordinator_->Register(*r, std::move(reply),
                               r->has_rejoin() ? std::string(ClientMetadata(*context, kMemberKeyHeader)) : "");
      });
}

grpc::ServerUnaryReactor* SchedulerService::Heartbeat(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  return ServeUnary<HeartbeatRequest, HeartbeatResponse>(
      context, request, response, *security_,
      [this, context](std::shared_ptr<const HeartbeatRequest> r, UnaryReply<HeartbeatResponse> reply) {
        TESSERA_REPLY_IF_ERROR(reply, CheckMember(*context, r->role(), r->id()));
        reply(coordinator_->Heartbeat(*r));
      });
}

grpc::ServerUnaryReactor* SchedulerService::Declare(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  return ServeUnary<DeclareRequest, DeclareResponse>(
      context, request, response, *security_,
      [this, context](std::shared_ptr<const DeclareRequest> r, UnaryReply<DeclareResponse> reply) {
        TESSERA_REPLY_IF_ERROR(reply, CheckMember(*context, tessera::v1::WORKER, r->worker_id()));
        coordinator_->Declare(*r, [reply = std::move(reply)](absl::StatusOr<ShardMap> map) {
          if (!map.ok()) {
            reply(map.status());
            return;
          }
          DeclareResponse declared;
          *declared.mutable_shard_map() = *std::move(map);
          reply(std::move(declared));
        });
      });
}

grpc::ServerUnaryReactor* SchedulerService::GetShardMap(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  return ServeUnary<GetShardMapRequest, ShardMap>(
      context, request, response, *security_,
      [this](std::shared_ptr<const GetShardMapRequest>, UnaryReply<ShardMap> reply) {
        reply(coordinator_->GetShardMap());
      });
}

grpc::ServerUnaryReactor* SchedulerService::AdvanceClock(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  return ServeUnary<AdvanceClockRequest, AdvanceClockResponse>(
      context, request, response, *security_,
      [this, context](std::shared_ptr<const AdvanceClockRequest> r, UnaryReply<AdvanceClockResponse> reply) {
        TESSERA_REPLY_IF_ERROR(reply, CheckMember(*context, tessera::v1::WORKER, r->worker_id()));
        // A caller that gave up (or went away) frees its place at the gate.
        coordinator_->AdvanceClock(*r, std::move(reply), [context] { return context->IsCancelled(); });
      });
}

grpc::ServerUnaryReactor* SchedulerService::Report(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  return ServeUnary<ReportRequest, ReportResponse>(
      context, request, response, *security_,
      [this, context](std::shared_ptr<const ReportRequest> r, UnaryReply<ReportResponse> reply) {
        TESSERA_REPLY_IF_ERROR(reply, CheckMember(*context, tessera::v1::WORKER, r->worker_id()));
        reply(coordinator_->Report(*r));
      });
}

grpc::ServerUnaryReactor* SchedulerService::Done(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  return ServeUnary<DoneRequest, DoneResponse>(
      context, request, response, *security_,
      [this, context](std::shared_ptr<const DoneRequest> r, UnaryReply<DoneResponse> reply) {
        TESSERA_REPLY_IF_ERROR(reply, CheckMember(*context, tessera::v1::WORKER, r->worker_id()));
        TESSERA_REPLY_IF_ERROR(reply, coordinator_->Done(*r));
        reply(DoneResponse());
      });
}

grpc::ServerUnaryReactor* SchedulerService::ReportServer(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  using tessera::v1::ReportServerRequest;
  using tessera::v1::ReportServerResponse;
  return ServeUnary<ReportServerRequest, ReportServerResponse>(
      context, request, response, *security_,
      [this, context](std::shared_ptr<const ReportServerRequest> r, UnaryReply<ReportServerResponse> reply) {
        const tessera::v1::Role role = r->role() == tessera::v1::SERVER ? tessera::v1::SERVER : tessera::v1::WORKER;
        TESSERA_REPLY_IF_ERROR(reply, CheckMember(*context, role, r->member_id()));
        TESSERA_REPLY_IF_ERROR(reply, coordinator_->ReportServer(*r));
        reply(ReportServerResponse());
      });
}

}  // namespace tessera
