// The gRPC adapter of the scheduler (callback API): converts messages and statuses, and never blocks a gRPC
// thread: AdvanceClock and Declare finish their reactors from the coordinator's completion callbacks.
#ifndef TESSERA_SCHEDULER_SCHEDULER_SERVICE_H_
#define TESSERA_SCHEDULER_SCHEDULER_SERVICE_H_

#include "proto/cluster.grpc.pb.h"
#include "scheduler/job_coordinator.h"

namespace tessera {

// Thread-safe.
class SchedulerService final : public tessera::v1::Scheduler::CallbackService {
 public:
  // `coordinator` is not owned and must outlive the service.
  explicit SchedulerService(JobCoordinator* coordinator) : coordinator_(coordinator) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context, const tessera::v1::RegisterRequest* request,
                                     tessera::v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const tessera::v1::HeartbeatRequest* request,
                                      tessera::v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Declare(grpc::CallbackServerContext* context, const tessera::v1::DeclareRequest* request,
                                    tessera::v1::DeclareResponse* response) override;
  grpc::ServerUnaryReactor* GetShardMap(grpc::CallbackServerContext* context,
                                        const tessera::v1::GetShardMapRequest* request,
                                        tessera::v1::ShardMap* response) override;
  grpc::ServerUnaryReactor* AdvanceClock(grpc::CallbackServerContext* context,
                                         const tessera::v1::AdvanceClockRequest* request,
                                         tessera::v1::AdvanceClockResponse* response) override;
  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext* context, const tessera::v1::ReportRequest* request,
                                   tessera::v1::ReportResponse* response) override;
  grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const tessera::v1::DoneRequest* request,
                                 tessera::v1::DoneResponse* response) override;

 private:
  JobCoordinator* const coordinator_;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_SCHEDULER_SERVICE_H_
