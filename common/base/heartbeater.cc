#include "common/base/heartbeater.h"

namespace tessera {

Heartbeater::Heartbeater(absl::Duration interval, std::function<absl::Status()> beat,
                         std::function<void(const absl::Status&)> on_lost, absl::Duration give_up_after)
    : interval_(interval), beat_(std::move(beat)), on_lost_(std::move(on_lost)), give_up_after_(give_up_after) {}

Heartbeater::~Heartbeater() { Stop(); }

void Heartbeater::Start() { thread_ = std::thread([this] { Run(); }); }

void Heartbeater::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Heartbeater::Run() {
  absl::Time last_success = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Wakes early on Stop().
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval_);
      if (stopping_) return;
    }
    absl::Status status = beat_();
    if (status.ok()) {
      last_success = absl::Now();
    } else if (absl::Now() - last_success >= give_up_after_) {
      on_lost_(status);
      return;
    }
  }
}

}  // namespace tessera
