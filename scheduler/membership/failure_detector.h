// Failure detection: every member heartbeats the scheduler; one silent for `timeout` is lost. Checked every
// `interval` on a thread of its own. Until every slot of the job is filled it also says, every
// kWaitingReportInterval, whom the job waits for and who was lost (ClusterView::WaitingSummary).
#ifndef TESSERA_SCHEDULER_MEMBERSHIP_FAILURE_DETECTOR_H_
#define TESSERA_SCHEDULER_MEMBERSHIP_FAILURE_DETECTOR_H_

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "common/base/heartbeater.h"
#include "scheduler/membership/cluster_view.h"

namespace tessera {

// Thread-safe: Check runs on the detector's thread (or a test's).
class FailureDetector {
 public:
  static constexpr absl::Duration kWaitingReportInterval = absl::Seconds(5);

  // `view` is not owned. The view publishes each member it declares lost to its subscribers; `on_lost`, when
  // given, also runs on the detector's thread for each.
  FailureDetector(ClusterView* view, absl::Duration timeout, std::function<void(const Member&)> on_lost = nullptr);
  ~FailureDetector();

  // Checks every `interval` until Stop() or destruction.
  void Start(absl::Duration interval);
  // Returns once no check runs any more. Idempotent.
  void Stop();

  // One check at `now`.
  void Check(absl::Time now);

  absl::Duration timeout() const { return timeout_; }

 private:
  ClusterView* const view_;
  const absl::Duration timeout_;
  const std::function<void(const Member&)> on_lost_;
  absl::Time next_waiting_report_;  // only Check, on one thread, uses it
  std::unique_ptr<Heartbeater> ticker_;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_MEMBERSHIP_FAILURE_DETECTOR_H_
