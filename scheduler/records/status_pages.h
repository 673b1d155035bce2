// The scheduler's /status page (JSON) and /metrics page (Prometheus text), and the parts of the summary they
// share, read from the parts of a job's coordinator (the view, the clock table, the balancer, the progress
// records, the checkpointer). Holds nothing of its own. Thread-safe, as each part is.
#ifndef TESSERA_SCHEDULER_RECORDS_STATUS_PAGES_H_
#define TESSERA_SCHEDULER_RECORDS_STATUS_PAGES_H_

#include <string>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "proto/job.pb.h"
#include "scheduler/gate/batch_balancer.h"
#include "scheduler/recovery/checkpointer.h"
#include "scheduler/gate/clock_table.h"
#include "scheduler/membership/cluster_view.h"
#include "scheduler/records/progress_records.h"

namespace tessera {

class StatusPages {
 public:
  // Every part must outlive the pages; `start` is when the job started.
  StatusPages(const tessera::v1::JobSpec& job, absl::Time start, const ClusterView& view, const ClockTable& clocks,
              const BatchBalancer& balancer, const ProgressRecords& records, const Checkpointer& checkpointer);

  // Job, members, clocks, last evaluation, progress history, staleness histogram; with `summary` (once the job
  // ended; null before), whether it completed and why it stopped.
  nlohmann::json StatusJson(const nlohmann::json* summary) const;
  // Members alive, checkpoints, the view's epoch, each worker's clock, late rounds and batch share, the
  // progress records' figures; `finished`: the job has ended.
  std::string MetricsText(bool finished) const;
  // SYNC: who made the recent rounds and how often each worker was late (backup workers).
  nlohmann::json RoundsJson() const;
  // The run's checkpoints: taken, failed, the latest.
  nlohmann::json CheckpointsJson() const;

 private:
  const tessera::v1::JobSpec& job_;
  const absl::Time start_;
  const ClusterView& view_;
  const ClockTable& clocks_;
  const BatchBalancer& balancer_;
  const ProgressRecords& records_;
  const Checkpointer& checkpointer_;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_RECORDS_STATUS_PAGES_H_
