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
#include "common/base/heartbeater.h"
#include "common/daemon/http_endpoint.h"
#include "common/rpc/rpc.h"
#include "scheduler/job_coordinator.h"
#include "scheduler/scheduler_options.h"
#include "scheduler/scheduler_service.h"
#include "scheduler/grpc_server_control.h"

namespace tessera {

// Thread-safe.
class Scheduler {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Scheduler>> Start(const SchedulerOptions& options);
  ~Scheduler();

  // Blocks until the job has finished or Stop() was called. A Stop() before the job's end is graceful: a
  // checkpoint first when the job takes them, then every worker is told to stop after its step and gets
  // --stop_grace_ms to report, then the job ends (summary.json with the stop reason; servers shut down). After a
  // job that ended by itself, with linger_s, /status, the dashboard and /metrics stay up that long (or until
  // Stop() is called), and serving stops. OK when the job completed; ABORTED with the reason when it ended without reaching its stop
  // condition (a member failed); Stop()'s reason otherwise.
  [[nodiscard]] absl::Status Wait();
  // Never blocks; safe from any thread. A second call cuts the graceful stop or the linger short.
  void Stop(absl::Status reason);
  // True once the job has finished or Stop() was called; waits at most `timeout`.
  bool WaitForStop(absl::Duration timeout);

  const std::string& address() const { return address_; }
  // The port of /healthz, /metrics and /status; 0 when off.
  int http_port() const { return http_ ? http_->port() : 0; }
  // "http://HOST:PORT/" (https with TLS) of the dashboard; empty when HTTP is off.
  const std::string& dashboard_url() const { return dashboard_url_; }
  JobCoordinator& coordinator() { return *coordinator_; }

 private:
  explicit Scheduler(const SchedulerOptions& options) : options_(options) {}
  // The dashboard, /status, /metrics, POST /drain and POST /checkpoint.
  absl::Status StartHttp();

  // The job's end as the coordinator reports it: the stop reason, unless Stop() gave one first.
  void JobEnded(absl::Status outcome);
  // The graceful part of Wait() after a Stop() before the job's end.
  void EndJobEarly(const absl::Status& reason);
  // Waits up to `timeout` for the job to finish or for a second Stop(); true if the job finished.
  bool AwaitFinishedOrInterrupted(absl::Duration timeout);
  bool JobEndedOrInterrupted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return job_ended_ || interrupted_; }

  const SchedulerOptions options_;
  std::string address_;
  std::string dashboard_url_;
  std::unique_ptr<GrpcServerControl> server_control_;
  std::unique_ptr<JobCoordinator> coordinator_;
  std::unique_ptr<SchedulerService> service_;
  StartedServer grpc_;
  std::unique_ptr<HttpEndpoint> http_;

  absl::Mutex mu_;
  std::optional<absl::Status> stop_reason_ ABSL_GUARDED_BY(mu_);
  bool stop_asked_ ABSL_GUARDED_BY(mu_) = false;   // Stop() was called
  bool job_ended_ ABSL_GUARDED_BY(mu_) = false;    // the coordinator reported the job's end
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;  // Stop() was called again
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_SCHEDULER_H_
