#include "scheduler/gate/clock_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {

ClockTable::ClockTable(int num_workers, int bound, int backups,
                       std::function<void(const RoundMembers&)> on_round_decided)
    : bound_(bound),
      backups_(bound == 0 ? backups : 0),
      on_round_decided_(std::move(on_round_decided)),
      clocks_(num_workers, 0),
      active_(num_workers, true),
      pushed_from_(num_workers, 0),
      late_rounds_(num_workers, 0),
      owes_rollback_(num_workers, false) {
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

int ClockTable::AtOrPastLocked(int64_t clock) const {
  int n = 0;
  for (size_t i = 0; i < clocks_.size(); ++i) n += active_[i] && clocks_[i] >= clock;
  return n;
}

bool ClockTable::GateOpenLocked(int64_t clock) const {
  if (stopped_) return true;
  if (hold_at_ >= 0 && clock >= hold_at_) return false;
  if (bound_ < 0) return true;
  if (backups_ > 0) return clock - 1 <= newest_decided_;
  return MinActiveLocked() >= clock - bound_;
}

void ClockTable::DecideRoundsLocked(std::vector<RoundMembers>& decided) {
  if (backups_ <= 0) return;
  const int active = static_cast<int>(std::count(active_.begin(), active_.end(), true));
  const int needed = std::max(1, active - backups_);
  while (active > 0 && AtOrPastLocked(newest_decided_ + 2) >= needed) {
    RoundMembers round;
    round.round = newest_decided_ + 1;
    for (size_t i = 0; i < clocks_.size(); ++i) {
      if (!active_[i]) continue;
      // A member pushed the round: it is past it, and did not skip it (a late answer, a rejoin past it).
      const bool pushed = clocks_[i] > round.round && round.round >= pushed_from_[i];
      (pushed ? round.members : round.late).push_back(static_cast<int>(i));
    }
    newest_decided_ = round.round;
    rounds_.push_back(round);
    if (rounds_.size() > kRoundsKept) rounds_.pop_front();
    decided.push_back(std::move(round));
  }
}

void ClockTable::Announce(const std::vector<RoundMembers>& decided) const {
  if (!on_round_decided_) return;
  for (const RoundMembers& round : decided) on_round_decided_(round);
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
    } else if (it->cancelled && it->cancelled()) {
      ready.emplace_back(std::move(it->done), absl::CancelledError(absl::StrCat(
                                                  "worker ", it->worker, " gave up waiting for step ", it->clock)));
    } else {
      ++it;
      continue;
    }
    it = waiters_.erase(it);
  }
}

void ClockTable::Advance(int worker, int64_t clock, absl::Time deadline, Callback done,
                         std::function<bool()> cancelled) {
  Ready ready;
  std::vector<RoundMembers> decided;
  {
    absl::MutexLock lock(&mu_);
    if (worker < 0 || worker >= static_cast<int>(clocks_.size())) {
      ready.emplace_back(std::move(done), absl::InvalidArgumentError(absl::StrCat(
                                              "worker id ", worker, " out of range 0..", clocks_.size() - 1)));
    } else if (stopped_) {
      // The job is over: whatever clock the worker is at (it may be one ahead of the table, or from before a
      // rollback), the answer is stop, at once.
      ready.emplace_back(std::move(done), GateResult{MinActiveLocked(), true, stop_reason_});
    } else if (owes_rollback_[worker] && clock != rolled_back_to_ + 1) {
      // Advanced from before the last rollback, which it had not heard of yet: told now, nothing changes.
      GateResult told{MinActiveLocked(), stopped_, stop_reason_, rolled_back_to_};
      told.rollback_generation = rollback_generation_;
      ready.emplace_back(std::move(done), told);
    } else if (clock < clocks_[worker]) {
      ready.emplace_back(std::move(done),
                         absl::InvalidArgumentError(absl::StrCat("worker ", worker, " clock went back from ",
                                                                 clocks_[worker], " to ", clock)));
    } else if (clock > clocks_[worker] + 1) {
      ready.emplace_back(std::move(done), absl::InvalidArgumentError(absl::StrCat(
                                              "worker ", worker, " clock jumped from ", clocks_[worker], " to ",
                                              clock, ": a worker advances one step at a time")));
    } else if (backups_ > 0 && !stopped_ && clock > clocks_[worker] && clock - 1 <= newest_decided_ &&
               active_[worker] &&
               std::none_of(rounds_.begin(), rounds_.end(), [&](const RoundMembers& r) {
                 return r.round == clock - 1 && std::binary_search(r.members.begin(), r.members.end(), worker);
               })) {
      // Round clock - 1 closed without this worker: on to the round after the newest decided one.
      ++late_rounds_[worker];
      clocks_[worker] = std::max(clock, newest_decided_ + 1);
      pushed_from_[worker] = clocks_[worker];  // it pushes every round from there on
      GateResult late{MinActiveLocked(), false, "", std::nullopt, clocks_[worker]};
      ready.emplace_back(std::move(done), late);
    } else {
      // A worker waits at one gate at a time: an earlier wait of its own was given up.
      for (auto it = waiters_.begin(); it != waiters_.end();) {
        if (it->worker != worker) {
          ++it;
          continue;
        }
        ready.emplace_back(std::move(it->done),
                           absl::AbortedError(absl::StrCat("worker ", worker, " advanced again, to ", clock)));
        it = waiters_.erase(it);
      }
      clocks_[worker] = clock;
      owes_rollback_[worker] = false;
      DecideRoundsLocked(decided);
      waiters_.push_back(Waiter{worker, clock, deadline, std::move(done), std::move(cancelled)});
      ++waiters_added_;
      CollectLocked(absl::Now(), ready);
    }
  }
  Announce(decided);
  for (auto& [callback, result] : ready) callback(std::move(result));
}

void ClockTable::OnMembership(const MembershipEvent& event) {
  switch (event.kind) {
    case MembershipEvent::kWorkerDone:
    case MembershipEvent::kWorkerLost:
      Done(event.member.id);
      break;
    case MembershipEvent::kWorkerRejoined:
      Rejoin(event.member.id, std::max<int64_t>(0, event.member.joined_clock - 1));
      break;
    default:
      break;
  }
}

void ClockTable::Done(int worker) {
  Ready ready;
  std::vector<RoundMembers> decided;
  {
    absl::MutexLock lock(&mu_);
    if (worker < 0 || worker >= static_cast<int>(clocks_.size())) return;
    active_[worker] = false;
    DecideRoundsLocked(decided);  // fewer workers to wait for
    CollectLocked(absl::Now(), ready);
  }
  Announce(decided);
  for (auto& [callback, result] : ready) callback(std::move(result));
}

int64_t ClockTable::Hold(int ahead) {
  absl::MutexLock lock(&mu_);
  int64_t newest = 0;
  for (size_t i = 0; i < clocks_.size(); ++i) {
    if (active_[i]) newest = std::max(newest, clocks_[i]);
  }
  hold_at_ = newest + std::max(1, ahead);
  return hold_at_;
}

int64_t ClockTable::HeldAt() const {
  absl::MutexLock lock(&mu_);
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

void ClockTable::RollBack(int64_t clock, uint64_t generation) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < clocks_.size(); ++i) {
      if (!active_[i]) continue;
      clocks_[i] = clock;
      pushed_from_[i] = clock;  // the rounds from the checkpoint's on are pushed again
      owes_rollback_[i] = true;
    }
    rolled_back_to_ = clock;
    rollback_generation_ = generation;
    hold_at_ = clock + 1;
    newest_decided_ = clock - 1;  // rounds from the checkpoint's on are decided again
    rounds_.clear();
    for (Waiter& w : waiters_) {
      GateResult result{clock, false, "", clock};
      result.rollback_generation = generation;
      ready.emplace_back(std::move(w.done), result);
    }
    waiters_.clear();
  }
  for (auto& [callback, result] : ready) callback(std::move(result));
}

void ClockTable::Rejoin(int worker, int64_t clock, int64_t pushed_from) {
  Ready ready;
  {
    absl::MutexLock lock(&mu_);
    if (worker < 0 || worker >= static_cast<int>(clocks_.size())) return;
    active_[worker] = true;
    clocks_[worker] = clock;
    pushed_from_[worker] = pushed_from < 0 ? clock : std::min(pushed_from, clock);
    owes_rollback_[worker] = false;
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
      for (const Waiter& w : waiters_) {
        next = std::min(next, w.deadline);
        // Callers that may give up are asked once a second.
        if (w.cancelled) next = std::min(next, absl::Now() + absl::Seconds(1));
      }
      // Wakes at the earliest deadline, or sooner when a waiter (whose deadline may be earlier) or shutdown
      // arrives (the condition is re-evaluated on every unlock of mu_).
      const uint64_t seen = waiters_added_;
      auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutting_down_ || waiters_added_ != seen; };
      mu_.AwaitWithDeadline(absl::Condition(&changed), next);
      if (shutting_down_) return;
      CollectLocked(absl::Now(), ready);
    }
    for (auto& [callback, result] : ready) callback(std::move(result));
  }
}

std::vector<RoundMembers> ClockTable::RecentRounds() const {
  absl::MutexLock lock(&mu_);
  return std::vector<RoundMembers>(rounds_.begin(), rounds_.end());
}

std::vector<int64_t> ClockTable::LateRounds() const {
  absl::MutexLock lock(&mu_);
  return late_rounds_;
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
