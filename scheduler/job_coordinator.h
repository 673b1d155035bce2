// The scheduler's logic, transport-free: it runs one job with the help of
//   ClusterView      (membership/cluster_view.h)       members, incarnations, chunk placement, sync round membership,
//                                                        epoch
//   FailureDetector  (membership/failure_detector.h)   heartbeats and lost members
//   ClockTable       (gate/clock_table.h)              every worker's clock and the consistency gate
//   BatchBalancer    (gate/batch_balancer.h)           SYNC: each worker's slice of a round's global batch
//   ProgressRecords  (records/progress_records.h)      reports, evaluations, server statistics, summary.json
//   StatusPages      (records/status_pages.h)          /status and /metrics, read from the parts above
//   Checkpointer     (recovery/checkpointer.h)         checkpoints: cadence, taking one, pruning, the latest to restore
//   ServerRecovery   (recovery/server_recovery.h)      a lost server's chunks taken over by backups or restored
//                                                        elsewhere
//   ServerMoves      (recovery/server_moves.h)         two-phase moves: a replacement's share, a drained server's chunks
//   JobTakeBack      (recovery/job_take_back.h)        a restarted scheduler taking its running job back from the members
//   JobEnd           (job_end.h)                       workers done or lost, the job failing or stopping, its verdict and
//                                                        summary
// It hands every new view to the servers. A change of members reaches the parts that care as an event the view
// publishes (membership/membership_events.h). The gRPC service (scheduler_service.h) only converts to and from it.
//
// A job's life: servers and workers Register (a slot, an incarnation and the JobSpec handed out) -> workers
// Declare their parameters (placed once every server is in; servers get the view before the map is returned)
// -> workers loop AdvanceClock / pull / compute / push, Report progress, and call Done -> when every worker is
// done (or lost) the coordinator collects the servers' statistics, writes summary.json, shuts the servers down
// and calls `on_finished` with the outcome.
//
// Failures: a lost worker leaves the clock gate and, through a new view, the sync rounds at once; the others go
// on (in every mode), and the rank may rejoin with a new incarnation (Register again). A lost server before
// the parameters are placed leaves its slot to a replacement; after, its chunks move to the servers left and
// are restored from the latest checkpoint (SYNC: every chunk and every worker go back to it), or, when the job
// has no checkpoint yet, the job stops with a reason naming it.
#ifndef TESSERA_SCHEDULER_JOB_COORDINATOR_H_
#define TESSERA_SCHEDULER_JOB_COORDINATOR_H_

#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/thread_pool.h"
#include "nlohmann/json.hpp"
#include "proto/cluster.pb.h"
#include "scheduler/gate/batch_balancer.h"
#include "scheduler/recovery/checkpointer.h"
#include "scheduler/gate/clock_table.h"
#include "scheduler/membership/cluster_view.h"
#include "scheduler/membership/failure_detector.h"
#include "scheduler/recovery/job_take_back.h"
#include "scheduler/gate/mode_rules.h"
#include "scheduler/job_end.h"
#include "scheduler/records/progress_records.h"
#include "scheduler/server_control.h"
#include "scheduler/recovery/server_moves.h"
#include "scheduler/recovery/server_recovery.h"
#include "scheduler/records/status_pages.h"

namespace tessera {

// Thread-safe.
class JobCoordinator {
 public:
  // `job` must be validated. `servers` is not owned and must outlive the coordinator. `on_finished` runs once,
  // on the coordinator's executor, after the summary is written and the servers were told to exit. A member
  // silent for `heartbeat_timeout` is lost. With `resume_dir`, the job goes on from the newest usable
  // checkpoint there (NOT_FOUND when there is none; FAILED_PRECONDITION when it is another job's or shape's).
  // `interrupted_run`: `run_dir` holds a run whose scheduler stopped before its end (see Register's take-back);
  // its records are added to, and nobody registers afresh within a heartbeat timeout of the start.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<JobCoordinator>> Create(
      tessera::v1::JobSpec job, const std::string& run_dir, absl::Duration heartbeat_interval,
      absl::Duration heartbeat_timeout, ServerControl* servers, std::function<void(const JobOutcome&)> on_finished,
      const std::string& resume_dir = "", bool interrupted_run = false);
  ~JobCoordinator();

  // Starts failure detection (every heartbeat interval), the checkpoint cadence and the job's time limit.
  void StartFailureDetection();

  // Takes a checkpoint now (SYNC: at the next clock, holding every worker there for a consistent cut) and
  // returns it; waits for it. FAILED_PRECONDITION when the job has no checkpoint.dir or nothing is declared.
  [[nodiscard]] absl::StatusOr<CheckpointInfo> Checkpoint(const std::string& why);

  // Calls `done` (on the executor) with the member's slot, incarnation and start clock. A worker rejoining a
  // running job is in the view the servers hold before `done` runs.
  //
  // A restarted scheduler takes its running job back from the members (`request.rejoin()`, `member_key` the
  // key the call carries): see JobTakeBack (recovery/job_take_back.h). Until the job is taken back, returning workers and
  // new registrations are answered UNAVAILABLE (they retry). A member coming back to a scheduler that started its
  // job afresh, or runs another job, gets FAILED_PRECONDITION; one with neither role, INVALID_ARGUMENT.
  void Register(const tessera::v1::RegisterRequest& request,
                std::function<void(absl::StatusOr<tessera::v1::RegisterResponse>)> done,
                const std::string& member_key = "");
  [[nodiscard]] absl::StatusOr<tessera::v1::HeartbeatResponse> Heartbeat(const tessera::v1::HeartbeatRequest& request);

  // Calls `done` (on the executor) with the cluster view, UNAVAILABLE naming the servers still missing, or the
  // placement's error.
  void Declare(const tessera::v1::DeclareRequest& request,
               std::function<void(absl::StatusOr<tessera::v1::ShardMap>)> done);
  // FAILED_PRECONDITION before anything is declared; UNAVAILABLE (retry) while a restarted scheduler has not
  // taken its job back yet.
  [[nodiscard]] absl::StatusOr<tessera::v1::ShardMap> GetShardMap() const;

  // See ClockTable::Advance; the answer also carries the worker's slice of the next round's global batch when
  // the job balances it. FAILED_PRECONDITION for a worker that is not in the job (lost or replaced).
  // INVALID_ARGUMENT for a step measure no worker of the job can send. `cancelled`: see ClockTable::Advance.
  void AdvanceClock(const tessera::v1::AdvanceClockRequest& request,
                    std::function<void(absl::StatusOr<tessera::v1::AdvanceClockResponse>)> done,
                    std::function<bool()> cancelled = nullptr);

  [[nodiscard]] absl::StatusOr<tessera::v1::ReportResponse> Report(const tessera::v1::ReportRequest& request);
  [[nodiscard]] absl::Status Done(const tessera::v1::DoneRequest& request);
  // A member could not reach a server: the server is probed at once (off the caller's thread) and declared lost
  // when it does not answer within a second either. INVALID_ARGUMENT for ids outside the job.
  [[nodiscard]] absl::Status ReportServer(const tessera::v1::ReportServerRequest& request);
  // Moves every copy server `server` holds to the others in two phases (no rollback, no step lost), then tells it
  // to exit (0); blocks until done. INVALID_ARGUMENT for an id outside the job; FAILED_PRECONDITION for a server
  // that is not alive, a job not placed yet, or chunks with nowhere to go.
  [[nodiscard]] absl::StatusOr<std::string> Drain(int server);

  // One failure-detection pass at `now` (tests; the detector's thread calls it otherwise).
  void CheckLiveness(absl::Time now) { failure_detector_.Check(now); }

  // Ends the job early: every clock gate opens with stop (no worker is left waiting), and the job will count as
  // not completed, `reason` being its stop reason. Never blocks; the job finishes as its workers report Done.
  void Abort(const std::string& reason);
  // Finishes the job now, whether or not every worker has reported (Abort first): writes the summary, shuts the
  // servers down. Returns once the job has finished (at once if it had).
  void FinishNow();

  // The scheduler's /status page: job, members, clocks, last evaluation, progress history, staleness histogram.
  nlohmann::json StatusJson() const;
  // The scheduler's /metrics page (Prometheus text format).
  std::string MetricsText() const;

  // The summary written at the end; empty before.
  nlohmann::json summary() const;
  bool finished() const;
  const tessera::v1::JobSpec& job() const { return job_; }
  std::vector<int64_t> clocks() const { return clocks_.Clocks(); }
  const ClusterView& view() const { return view_; }

 private:
  JobCoordinator(tessera::v1::JobSpec job, std::unique_ptr<RunRecorder> recorder, absl::Duration heartbeat_interval,
                 absl::Duration heartbeat_timeout, ServerControl* servers,
                 std::function<void(const JobOutcome&)> on_finished);

  tessera::v1::ReportResponse StopResponse() const;
  // Register's answer for `member`, as it is now.
  tessera::v1::RegisterResponse Registered(const Member& member);
  // Register with a rejoin, on the executor.
  void TakeBack(const tessera::v1::RegisterRequest& request, const std::string& member_key,
                std::function<void(absl::StatusOr<tessera::v1::RegisterResponse>)> done);
  // A resumed job whose servers have not been restored yet.
  bool Resuming() const;
  // Where a worker taking slot `member` starts: 0 for a new rank (a resumed job's: the checkpoint's clock); for a
  // rank coming back, as the mode's rules say (ModeRules::ReturningStart).
  int64_t StartClock(const Member& member) const;
  // The clock gate's answer to `worker` advancing to `clock`: the gate's result, the clocks joiners start at,
  // the values keeper and the worker's slice of the next round's batch.
  tessera::v1::AdvanceClockResponse GateAnswer(int worker, int64_t clock, const GateResult& gate);
  // SYNC with backup workers: the clock table decided a round; its members go to the servers.
  void OnRoundDecided(const RoundMembers& round);
  // Subscribed to the view (after the records, the clock table and the server recovery): a worker that joins
  // or rejoins is handed to the servers with the view; one lost or done may end the job.
  void OnMembership(const MembershipEvent& event);
  // `failure`: the error the worker said it stopped on; empty when it fell silent. The job's end (JobEnd) keeps
  // it; the servers get the new view.
  void WorkerLost(const Member& member, const std::string& failure);

  // Executor tasks.
  // Hands the current view to every server.
  void PublishView(const std::string& why);
  // SYNC: with `keep_hold`, the workers stay held at the checkpoint's clock (the caller releases them).
  absl::StatusOr<CheckpointInfo> TakeCheckpoint(const std::string& why, bool keep_hold = false);

  // Constant after construction.
  const tessera::v1::JobSpec job_;
  const absl::Duration heartbeat_interval_;
  ServerControl* const servers_;  // not owned
  const absl::Time start_;
  const ModeRules rules_;  // what the consistency mode means here

  ClusterView view_;
  ClockTable clocks_;
  BatchBalancer balancer_;
  ProgressRecords records_;
  FailureDetector failure_detector_;
  Checkpointer checkpointer_;
  ServerRecovery recovery_;
  ServerMoves moves_;
  JobTakeBack take_back_;
  StatusPages pages_;  // reads the parts above
  JobEnd end_;         // workers done or lost, the verdict, the summary
  // Checks the checkpoint cadence, stop.max_seconds and a job end held back for a failed worker's return.
  std::unique_ptr<Heartbeater> ticker_;

  mutable absl::Mutex mu_;
  bool checkpoint_queued_ ABSL_GUARDED_BY(mu_) = false;
  // A resumed job: the checkpoint the servers restore from once they are all in (at the first Declare).
  std::optional<CheckpointInfo> resume_ ABSL_GUARDED_BY(mu_);
  bool rounds_queued_ ABSL_GUARDED_BY(mu_) = false;  // a DecideRounds send is waiting in round_sender_
  std::set<int> probing_ ABSL_GUARDED_BY(mu_);        // servers a worker reported, being probed
  // Probes servers workers could not reach (ReportServer).
  SerialExecutor prober_;

  // SYNC with backup workers: sends round decisions to the servers, off the clock table's callers.
  SerialExecutor round_sender_;

  // Last member: destroyed first, so queued tasks finish while everything above is alive.
  SerialExecutor executor_;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_JOB_COORDINATOR_H_
