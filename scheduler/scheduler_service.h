// The scheduler's gRPC face: authenticates and parses each call (common/rpc/rpc_handler.h), checks that a member
// acts only for itself, and hands the request to the JobCoordinator.
//
// Who may call what: Register and GetShardMap need the job token only; Heartbeat, Declare, AdvanceClock, Report,
// Done and ReportServer also need the member key of the member they name (RegisterResponse.member_key): a worker cannot
// heartbeat, clock, report or finish for another rank.
#ifndef TESSERA_SCHEDULER_SCHEDULER_SERVICE_H_
#define TESSERA_SCHEDULER_SCHEDULER_SERVICE_H_

#include <memory>

#include "common/rpc/security.h"
#include "proto/cluster.grpc.pb.h"
#include "scheduler/job_coordinator.h"

namespace tessera {

// Every method takes its request as bytes, so that an unparsable one is answered like everywhere else.
using SchedulerBase = tessera::v1::Scheduler::WithRawCallbackMethod_Register<
    tessera::v1::Scheduler::WithRawCallbackMethod_Heartbeat<
    tessera::v1::Scheduler::WithRawCallbackMethod_Declare<
    tessera::v1::Scheduler::WithRawCallbackMethod_GetShardMap<
    tessera::v1::Scheduler::WithRawCallbackMethod_AdvanceClock<
    tessera::v1::Scheduler::WithRawCallbackMethod_Report<
    tessera::v1::Scheduler::WithRawCallbackMethod_Done<
    tessera::v1::Scheduler::WithRawCallbackMethod_ReportServer<tessera::v1::Scheduler::CallbackService>>>>>>>>;

class SchedulerService final : public SchedulerBase {
 public:
  // `coordinator` is not owned and must outlive the service.
  SchedulerService(JobCoordinator* coordinator, std::shared_ptr<const Security> security)
      : coordinator_(coordinator), security_(std::move(security)) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Declare(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetShardMap(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* AdvanceClock(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReportServer(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

 private:
  // OK when the call carries the member key of (role, id).
  absl::Status CheckMember(const grpc::CallbackServerContext& context, tessera::v1::Role role, int id) const;

  JobCoordinator* const coordinator_;
  const std::shared_ptr<const Security> security_;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_SCHEDULER_SERVICE_H_
