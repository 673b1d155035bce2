#include "scheduler/membership/failure_detector.h"

#include "glog/logging.h"

namespace tessera {

FailureDetector::FailureDetector(ClusterView* view, absl::Duration timeout, std::function<void(const Member&)> on_lost)
    : view_(view),
      timeout_(timeout),
      on_lost_(std::move(on_lost)),
      next_waiting_report_(absl::Now() + kWaitingReportInterval) {}

FailureDetector::~FailureDetector() { Stop(); }

void FailureDetector::Stop() {
  if (ticker_) ticker_->Stop();
}

void FailureDetector::Start(absl::Duration interval) {
  ticker_ = std::make_unique<Heartbeater>(
      interval,
      [this] {
        Check(absl::Now());
        return absl::OkStatus();
      },
      [](const absl::Status&) {}, absl::InfiniteDuration());
  ticker_->Start();
}

void FailureDetector::Check(absl::Time now) {
  for (const Member& m : view_->MarkSilentLost(now, timeout_)) {
    if (on_lost_) on_lost_(m);
  }
  if (now >= next_waiting_report_) {
    const std::string waiting = view_->WaitingSummary(now, timeout_);
    if (!waiting.empty()) {
      LOG(INFO) << waiting;
      next_waiting_report_ = now + kWaitingReportInterval;
    }
  }
}

}  // namespace tessera
