// The scheduler's logic, transport-free: membership, shard placement, clocks and staleness gating, progress
// records and the end of the job. The gRPC service (scheduler_service.h) only converts to and from it.
//
// A job's life: servers and workers Register (ids and the JobSpec handed out) -> workers Declare their
// parameters (placed once every server is in; servers get their chunks before the map is returned) -> workers
// loop AdvanceClock / pull / compute / push, Report progress, and call Done -> when every worker is done the
// coordinator collects the servers' statistics, writes summary.json, shuts the servers down and calls
// `on_finished`.
#ifndef TESSERA_SCHEDULER_JOB_COORDINATOR_H_
#define TESSERA_SCHEDULER_JOB_COORDINATOR_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/run_recorder.h"
#include "common/thread_pool.h"
#include "nlohmann/json.hpp"
#include "proto/cluster.pb.h"
#include "scheduler/clock_table.h"
#include "scheduler/membership.h"
#include "scheduler/server_control.h"

namespace tessera {

// Thread-safe.
class JobCoordinator {
 public:
  // `job` must be validated. `servers` is not owned and must outlive the coordinator. `on_finished` runs once,
  // on the coordinator's executor, after the summary is written and the servers were told to exit.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<JobCoordinator>> Create(
      tessera::v1::JobSpec job, const std::string& run_dir, absl::Duration heartbeat_interval,
      ServerControl* servers, std::function<void()> on_finished);
  ~JobCoordinator();

  [[nodiscard]] absl::StatusOr<tessera::v1::RegisterResponse> Register(const tessera::v1::RegisterRequest& request);
  [[nodiscard]] absl::StatusOr<tessera::v1::HeartbeatResponse> Heartbeat(const tessera::v1::HeartbeatRequest& request);

  // Calls `done` (on the executor) with the shard map, UNAVAILABLE while servers are still missing, or the
  // placement's error.
  void Declare(const tessera::v1::DeclareRequest& request,
               std::function<void(absl::StatusOr<tessera::v1::ShardMap>)> done);
  // FAILED_PRECONDITION before anything is declared.
  [[nodiscard]] absl::StatusOr<tessera::v1::ShardMap> GetShardMap() const;

  // See ClockTable::Advance.
  void AdvanceClock(const tessera::v1::AdvanceClockRequest& request, ClockTable::Callback done);

  [[nodiscard]] absl::StatusOr<tessera::v1::ReportResponse> Report(const tessera::v1::ReportRequest& request);
  [[nodiscard]] absl::Status Done(const tessera::v1::DoneRequest& request);

  // Failure detection, called periodically: a worker silent for `timeout` is lost. It leaves the clock gate at
  // once (ASYNC and SSP go on without it); in SYNC, whose rounds need every worker, the job stops with the
  // reason. A lost worker counts as done, so the job still ends and writes its summary.
  // Until every member has registered, it also logs whom the job waits for (Membership::WaitingSummary), at
  // most every kWaitingReportInterval.
  void CheckLiveness(absl::Time now, absl::Duration timeout);
  static constexpr absl::Duration kWaitingReportInterval = absl::Seconds(5);

  // Ends the job early: every clock gate opens with stop (no worker is left waiting). Never blocks.
  void Abort(const std::string& reason) { clocks_.Stop(reason); }

  // The scheduler's /status page: job, members, clocks, last evaluation, progress history, staleness histogram.
  nlohmann::json StatusJson() const;
  // The scheduler's /metrics page (Prometheus text format).
  std::string MetricsText() const;

  // The summary written at the end; empty before.
  nlohmann::json summary() const;
  bool finished() const;
  const tessera::v1::JobSpec& job() const { return job_; }
  std::vector<int64_t> clocks() const { return clocks_.Clocks(); }

 private:
  JobCoordinator(tessera::v1::JobSpec job, std::unique_ptr<RunRecorder> recorder, absl::Duration heartbeat_interval,
                 ServerControl* servers, std::function<void()> on_finished);

  tessera::v1::ReportResponse StopResponse() const;
  // Marks `worker` done; queues the end of the job when it was the last.
  void MarkDoneLocked(int worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Executor tasks.
  void WriteEvalRecord(const tessera::v1::ReportRequest& eval);
  void FinishJob();

  // Constant after construction.
  const tessera::v1::JobSpec job_;
  const std::unique_ptr<RunRecorder> recorder_;
  const absl::Duration heartbeat_interval_;
  ServerControl* const servers_;  // not owned
  const std::function<void()> on_finished_;
  const absl::Time start_;

  Membership membership_;
  // Used by CheckLiveness only, which one thread (the failure detector) calls.
  absl::Time next_waiting_report_;
  ClockTable clocks_;

  mutable absl::Mutex mu_;
  std::optional<tessera::v1::ShardMap> map_ ABSL_GUARDED_BY(mu_);
  std::vector<tessera::v1::ReportRequest> last_report_ ABSL_GUARDED_BY(mu_);  // per worker
  std::vector<bool> done_ ABSL_GUARDED_BY(mu_);
  std::vector<int> lost_ ABSL_GUARDED_BY(mu_);
  std::optional<tessera::v1::ReportRequest> last_eval_ ABSL_GUARDED_BY(mu_);
  std::optional<double> seconds_to_target_ ABSL_GUARDED_BY(mu_);
  std::vector<EvalRecord> history_ ABSL_GUARDED_BY(mu_);                 // every progress record, for /status
  tessera::v1::StalenessHistogram staleness_ ABSL_GUARDED_BY(mu_);       // as of the last record
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  nlohmann::json summary_ ABSL_GUARDED_BY(mu_);

  // Last member: destroyed first, so queued tasks finish while everything above is alive.
  SerialExecutor executor_;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_JOB_COORDINATOR_H_
