// The job's records as the scheduler keeps them: each worker's last report, the evaluations, the progress
// history for /status, the servers' last statistics (kept when a server is lost, so counters survive it), and
// the summary written at the end.
#ifndef TESSERA_SCHEDULER_RECORDS_PROGRESS_RECORDS_H_
#define TESSERA_SCHEDULER_RECORDS_PROGRESS_RECORDS_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/daemon/run_recorder.h"
#include "common/daemon/metrics_page.h"
#include "nlohmann/json.hpp"
#include "proto/cluster.pb.h"
#include "proto/ps.pb.h"
#include "scheduler/membership/membership_events.h"
#include "scheduler/server_control.h"

namespace tessera {

// What the job's end says happened, for the summary and the scheduler's exit code.
struct JobOutcome {
  bool completed = false;   // the job reached its stop condition
  std::string stop_reason;  // names the member that failed, when one did
};

// Thread-safe.
class ProgressRecords {
 public:
  // At most this many progress records are kept for /status (the file metrics.jsonl keeps them all).
  // What /status and summary.json keep: the newest evaluations and membership events.
  static constexpr size_t kHistoryLimit = 2000;
  static constexpr size_t kEventLimit = 1000;

  ProgressRecords(const tessera::v1::JobSpec& job, std::unique_ptr<RunRecorder> recorder, absl::Time start);

  // A worker's report (validated). An evaluation is taken only when its values are newer than the last one
  // taken, so records grow with the job's clocks, not with its reports.
  struct Taken {
    bool evaluation = false;  // the report's evaluation was taken: write its record
    std::string reached;      // ... and it reached the job's target accuracy: the stop reason (empty: not)
  };
  Taken AddReport(const tessera::v1::ReportRequest& report);

  // Worker `worker` finished step `clock`. The summary's "training" span runs from the first step any worker
  // finished to the last: the steps' own time, without start-up, declaration or data loading (what a benchmark
  // compares with a loop timed the same way). It also says when every worker had finished a step
  // ("every_worker_stepped_wall_seconds"): the start of training in a cluster whose workers load their data at
  // different speeds.
  void NoteClock(int worker, int64_t clock);
  // The line printed when a worker finished its first step: "worker 3" and this.
  static constexpr char kFirstStepSuffix[] = " finished its first step";

  // Takes the servers' answers to a statistics request; a server that did not answer keeps its last figures.
  void UpdateServerStats(const std::vector<ServerStatsAnswer>& answers);
  // The statistics of every server ever heard from, summed.
  ClusterStats ServerTotals() const;
  // The embedding tables, by name: rows and memory on each live server, and totals of their counters and
  // staleness over every server the job had (summary.json's "tables").
  nlohmann::json TablesJson() const;

  // Appends the progress record of evaluation `eval` (metrics.jsonl, a progress line, /status).
  void WriteEvalRecord(const tessera::v1::ReportRequest& eval);

  // Notes a recovery or a loss for the summary (a JSON object: what, who, when, ...).
  void AddEvent(nlohmann::json event);
  // Subscribed to the cluster view: the event log's entry for a worker lost or failed (at `worker_clock`),
  // rejoined, or a server lost or replaced. (Recoveries log their own, with what they moved.)
  void OnMembership(const MembershipEvent& event, int64_t worker_clock);

  // Makes the summary and writes summary.json. `steps` is the smallest of `counted_clocks` (the workers that
  // stayed in the job); the fields of `extra` are added. PrintSummary then announces it ("summary: ...") once
  // /status says the job has finished.
  nlohmann::json SaveSummary(const JobOutcome& outcome, const std::vector<int64_t>& worker_clocks,
                             const std::vector<int64_t>& counted_clocks, const std::vector<int>& lost_workers,
                             const nlohmann::json& extra = nlohmann::json::object());
  void PrintSummary(const nlohmann::json& summary) { recorder_->PrintSummary(summary); }
  // A job started afresh in the run directory of an unfinished one: see RunRecorder::StartAfresh.
  // The events taken back are dropped, and the run starts now.
  [[nodiscard]] absl::Status StartAfresh();

  // A restarted scheduler's: the events of the run's earlier lives (RunRecorder::ReadEvents) go before its own,
  // and the run's start is the first life's (events' and evaluations' wall_seconds go on from it).
  void TakeBackEvents(std::vector<nlohmann::json> earlier);
  // When the run began: the scheduler's start, or its first life's (TakeBackEvents).
  absl::Time run_start() const;

  // Parts of /status and /metrics.
  void AddToStatus(nlohmann::json& status) const;
  // The newest evaluation's families, for the scheduler's /metrics.
  void AddMetrics(MetricsPage& page) const;

 private:
  // {"all": histogram, "workers": [histogram by worker id]} (StalenessHistogram::ToJson).
  static nlohmann::json StalenessJson(const ClusterStats& sum);
  const tessera::v1::JobSpec job_;
  const std::unique_ptr<RunRecorder> recorder_;
  mutable absl::Mutex mu_;
  absl::Time start_ ABSL_GUARDED_BY(mu_);
  std::vector<tessera::v1::ReportRequest> last_report_ ABSL_GUARDED_BY(mu_);  // per worker
  std::optional<tessera::v1::ReportRequest> last_eval_ ABSL_GUARDED_BY(mu_);
  std::optional<double> seconds_to_target_ ABSL_GUARDED_BY(mu_);
  TrainingSpan training_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> stepped_ ABSL_GUARDED_BY(mu_);  // per worker: it finished a step
  // Per worker, when it finished each of its latest kStepTimesKept steps (an evaluation's record says when the
  // values it scored were made).
  static constexpr size_t kStepTimesKept = 4096;
  std::vector<std::map<int64_t, absl::Time>> step_times_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> every_worker_stepped_ ABSL_GUARDED_BY(mu_);
  std::deque<EvalRecord> history_ ABSL_GUARDED_BY(mu_);
  struct Entry {
    tessera::v1::ServerStats stats;
    bool live = false;  // in the last request's map
  };
  // The last answer of each server, by (id, incarnation).
  std::map<std::pair<int, uint64_t>, Entry> server_stats_ ABSL_GUARDED_BY(mu_);
  nlohmann::json events_ ABSL_GUARDED_BY(mu_) = nlohmann::json::array();
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_RECORDS_PROGRESS_RECORDS_H_
