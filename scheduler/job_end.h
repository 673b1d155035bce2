// How a job ends, JobCoordinator's part of it (scheduler/job_coordinator.h): workers done or lost, the job
// failing or stopping, its verdict (decided once: "completed", or failed with a reason), and the one finish that
// collects the servers' statistics, writes summary.json, lets the servers go and reports the outcome.
#ifndef TESSERA_SCHEDULER_JOB_END_H_
#define TESSERA_SCHEDULER_JOB_END_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/thread_pool.h"
#include "nlohmann/json.hpp"
#include "proto/cluster.pb.h"
#include "scheduler/gate/batch_balancer.h"
#include "scheduler/gate/clock_table.h"
#include "scheduler/membership/cluster_view.h"
#include "scheduler/records/progress_records.h"
#include "scheduler/records/status_pages.h"
#include "scheduler/server_control.h"

namespace tessera {

// Thread-safe. The parts are the coordinator's and must outlive it.
class JobEnd {
 public:
  struct Parts {
    const tessera::v1::JobSpec* job;
    ClusterView* view;
    ClockTable* clocks;
    BatchBalancer* balancer;
    ProgressRecords* records;
    StatusPages* pages;
    ServerControl* servers;
    SerialExecutor* executor;  // the job's end runs on it, never beside a recovery or a view change
  };
  // A worker silent for `heartbeat_timeout` is lost; `on_finished` runs once, on the executor, after the summary
  // is written and the servers were told to exit.
  JobEnd(Parts parts, absl::Duration heartbeat_timeout, std::function<void(const JobOutcome&)> on_finished);

  // A worker says it is done, or stopped on an error (request.failure): see JobCoordinator::Done.
  [[nodiscard]] absl::Status WorkerDone(const tessera::v1::DoneRequest& request);
  // A worker left the job lost (`failure`: the error it said it stopped on; empty when it fell silent): logged
  // and kept for the summary.
  void NoteWorkerLost(const Member& member, const std::string& failure);
  // The job cannot complete (a server lost for good): records `reason` and stops every gate. Once the job's
  // verdict is "completed" (Completed()), nothing is recorded: a loss after the job's end is no failure.
  void Fail(const std::string& reason);
  // The job stops because it is complete (the target reached, stop.max_seconds): the verdict is "completed" from
  // here on (unless the job had failed already), then every gate opens with `why`.
  void StopCompleted(const std::string& why);
  // Whether the job's verdict is "completed": it stopped complete (StopCompleted), or no worker is left before its
  // last step (every one done, lost, or alive at stop.max_steps) and one at least ran its course. Decided once and
  // for good: no later loss of a server or worker, and no stop asked for, makes the job a failure.
  bool Completed();
  // Ends the job early: the job will count as not completed, `reason` being its stop reason (see
  // JobCoordinator::Abort).
  void Abort(const std::string& reason);
  // Queues the end of the job once no worker is alive any more (all done or lost).
  void MaybeFinish();
  // Once the job has failed (a server lost for good), the workers get a heartbeat timeout to hear of it and
  // report; after that the job ends without those still running (stuck on a server that is gone). Once it
  // stopped complete (the target reached, stop.max_seconds), twice that, and it ends completed. The ticker calls
  // it.
  void EndAStopNobodyFinishes();
  // Finishes the job now and returns once it has finished (see JobCoordinator::FinishNow).
  void FinishNow();

  // A worker said it stopped on an error and the job is not finishing: its end waits for the worker's return.
  bool FailureReportPending() const;
  // The job's end is queued or done: no checkpoint is taken any more.
  bool finishing() const;
  bool finished() const;
  // The summary written at the end; empty before.
  nlohmann::json summary() const;

 private:
  // Every way the job stops: the clock gate says stop, and the servers are handed no view any more.
  void StopClocks(const std::string& why);
  // On the executor: the statistics, the summary, the servers' shutdown and the outcome.
  void Finish();

  const Parts parts_;
  const absl::Duration heartbeat_timeout_;
  const std::function<void(const JobOutcome&)> on_finished_;

  mutable absl::Mutex mu_;
  std::vector<int> lost_workers_ ABSL_GUARDED_BY(mu_);  // every rank ever lost, in order
  std::map<int, std::string> worker_failures_ ABSL_GUARDED_BY(mu_);  // why each rank last left, when it said
  std::string failure_ ABSL_GUARDED_BY(mu_);            // why the job cannot complete; empty: it can
  bool completed_ ABSL_GUARDED_BY(mu_) = false;         // the verdict "completed" is decided (Completed())
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time stopped_seen_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // when the ticker saw the stop
  // When a worker last said it stopped on an error; the job's end waits a heartbeat timeout past it (the ticker
  // asks MaybeFinish again).
  absl::Time last_failure_report_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  nlohmann::json summary_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_JOB_END_H_
