#include "scheduler/clock_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {

ClockTable::ClockTable(int num_workers, int bound)
    : bound_(bound), clocks_(num_workers, 0), active_(num_workers, true) {
  deadline_thread_ = std::thread([this] { RunDeadlines(); });
}

ClockTable::~ClockTable() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  deadline_thread_.join();
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    for (Waiter& w : waiters_) {
      ready.emplace_back(std::move(w.done), absl::CancelledError("scheduler shutting down"));
    }
    waiters_.clear();
  }
  for (auto& [done, result] : ready) done(std::move(result));
}

int64_t ClockTable::MinActiveLocked() const {
  int64_t min = INT64_MAX;
  for (size_t i = 0; i < clocks_.size(); ++i) {
    if (active_[i]) min = std::min(min, clocks_[i]);
  }
  if (min == INT64_MAX) {  // nobody active: nobody holds anyone back
    return clocks_.empty() ? 0 : *std::max_element(clocks_.begin(), clocks_.end());
  }
  return min;
}

bool ClockTable::GateOpenLocked(int64_t clock) const {
  if (stopped_) return true;
  if (hold_at_ >= 0 && clock >= hold_at_) return false;
  if (bound_ < 0) return true;
  return MinActiveLocked() >= clock - bound_;
}

std::string ClockTable::StragglersLocked(int64_t clock) const {
  std::vector<std::string> names;
  for (size_t i = 0; i < clocks_.size(); ++i) {
    if (active_[i] && clocks_[i] < clock - bound_) names.push_back(absl::StrCat("worker ", i, " at clock ", clocks_[i]));
  }
  return absl::StrJoin(names, ", ");
}

void ClockTable::CollectLocked(absl::Time now, Ready& ready) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (GateOpenLocked(it->clock)) {
      ready.emplace_back(std::move(it->done), GateResult{MinActiveLocked(), stopped_, stop_reason_});
    } else if (now >= it->deadline) {
      ready.emplace_back(std::move(it->done),
                         absl::DeadlineExceededError(absl::StrCat(
                             "worker ", it->worker, " waited for the clock gate of step ", it->clock,
                             " until its deadline; still waiting for: ", StragglersLocked(it->clock))));
    } else {
      ++it;
      continue;
    }
    it = waiters_.erase(it);
  }
}

void ClockTable::Advance(int worker, int64_t clock, absl::Time deadline, Callback done) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (worker < 0 || worker >= static_cast<int>(clocks_.size())) {
      ready.emplace_back(std::move(done), absl::InvalidArgumentError(absl::StrCat(
                                              "worker id ", worker, " out of range 0..", clocks_.size() - 1)));
    } else if (clock < clocks_[worker] && clock != rolled_back_to_ + 1) {  // after a rollback it may go back
      ready.emplace_back(std::move(done),
                         absl::InvalidArgumentError(absl::StrCat("worker ", worker, " clock went back from ",
                                                                 clocks_[worker], " to ", clock)));
    } else {
      clocks_[worker] = clock;
      waiters_.push_back(Waiter{worker, clock, deadline, std::move(done)});
      CollectLocked(absl::Now(), ready);
    }
  }
  for (auto& [callback, result] : ready) callback(std::move(result));
}

void ClockTable::Done(int worker) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (worker < 0 || worker >= static_cast<int>(clocks_.size())) return;
    active_[worker] = false;
    CollectLocked(absl::Now(), ready);
  }
  for (auto& [callback, result] : ready) callback(std::move(result));
}

int64_t ClockTable::Hold() {
  absl::MutexLock lock(&mu_);
  int64_t newest = 0;
  for (size_t i = 0; i < clocks_.size(); ++i) {
    if (active_[i]) newest = std::max(newest, clocks_[i]);
  }
  hold_at_ = newest + 1;
  return hold_at_;
}

void ClockTable::Release() {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    hold_at_ = -1;
    CollectLocked(absl::Now(), ready);
  }
  for (auto& [callback, result] : ready) callback(std::move(result));
}

void ClockTable::ExpectRollback(int64_t clock) {
  absl::MutexLock lock(&mu_);
  rolled_back_to_ = clock;
}

void ClockTable::RollBack(int64_t clock) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < clocks_.size(); ++i) {
      if (active_[i]) clocks_[i] = clock;
    }
    rolled_back_to_ = clock;
    for (Waiter& w : waiters_) {
      GateResult result{clock, false, "", clock};
      ready.emplace_back(std::move(w.done), result);
    }
    waiters_.clear();
  }
  for (auto& [callback, result] : ready) callback(std::move(result));
}

void ClockTable::Rejoin(int worker, int64_t clock) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (worker < 0 || worker >= static_cast<int>(clocks_.size())) return;
    active_[worker] = true;
    clocks_[worker] = clock;
    CollectLocked(absl::Now(), ready);
  }
  for (auto& [callback, result] : ready) callback(std::move(result));
}

std::vector<int64_t> ClockTable::ActiveClocks() const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> out;
  for (size_t i = 0; i < clocks_.size(); ++i) {
    if (active_[i]) out.push_back(clocks_[i]);
  }
  return out;
}

void ClockTable::Stop(const std::string& reason) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_) {
      stopped_ = true;
      stop_reason_ = reason;
    }
    CollectLocked(absl::Now(), ready);
  }
  for (auto& [callback, result] : ready) callback(std::move(result));
}

void ClockTable::RunDeadlines() {
  while (true) {
    Ready ready;
    {
      absl::MutexLock lock(&mu_);
      absl::Time next = absl::InfiniteFuture();
      for (const Waiter& w : waiters_) next = std::min(next, w.deadline);
      // Wakes at the earliest deadline, or sooner when a waiter or shutdown arrives (the condition is
      // re-evaluated on every unlock of mu_).
      const size_t seen = waiters_.size();
      auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (shutting_down_ || waiters_.size() > seen) return true;
        return false;
      };
      mu_.AwaitWithDeadline(absl::Condition(&changed), next);
      if (shutting_down_) return;
      CollectLocked(absl::Now(), ready);
    }
    for (auto& [callback, result] : ready) callback(std::move(result));
  }
}

std::vector<int64_t> ClockTable::Clocks() const {
  absl::MutexLock lock(&mu_);
  return clocks_;
}

bool ClockTable::stopped() const {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

}  // namespace tessera

namespace tessera {

std::string ClockTable::stop_reason() const {
  absl::MutexLock lock(&mu_);
  return stop_reason_;
}

}  // namespace tessera
