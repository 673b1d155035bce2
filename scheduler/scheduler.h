// The scheduler's lifecycle: listen, coordinate one job, exit when it is over.
//
//   SchedulerOptions options;
//   options.job = *LoadSchedulerJob("deploy/jobs/fashion_mnist_mlp_sync.pbtxt", 0, 0);
//   TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler, Scheduler::Start(options));
//   std::cout << scheduler->address();   // give this to servers and workers
//   absl::Status exit = scheduler->Wait();  // until the job ends or Stop()
#ifndef TESSERA_SCHEDULER_SCHEDULER_H_
#define TESSERA_SCHEDULER_SCHEDULER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/heartbeater.h"
#include "common/http_endpoint.h"
#include "scheduler/job_coordinator.h"
#include "scheduler/scheduler_options.h"
#include "scheduler/scheduler_service.h"
#include "scheduler/server_pool.h"

namespace tessera {

// Thread-safe.
class Scheduler {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Scheduler>> Start(const SchedulerOptions& options);
  ~Scheduler();

  // Blocks until the job has finished or Stop() was called; then stops serving. OK when the job completed;
  // ABORTED with the reason when it ended without reaching its stop condition (a member failed); Stop()'s
  // reason otherwise.
  [[nodiscard]] absl::Status Wait();
  // Never blocks; safe from any thread.
  void Stop(absl::Status reason);
  // True once the job has finished or Stop() was called; waits at most `timeout`.
  bool WaitForStop(absl::Duration timeout);

  const std::string& address() const { return address_; }
  // The port of /healthz, /metrics and /status; 0 when off.
  int http_port() const { return http_ ? http_->port() : 0; }
  JobCoordinator& coordinator() { return *coordinator_; }

 private:
  Scheduler() = default;

  std::string address_;
  std::unique_ptr<GrpcServerControl> server_control_;
  std::unique_ptr<JobCoordinator> coordinator_;
  std::unique_ptr<SchedulerService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<HttpEndpoint> http_;

  absl::Mutex mu_;
  std::optional<absl::Status> stop_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_SCHEDULER_H_
