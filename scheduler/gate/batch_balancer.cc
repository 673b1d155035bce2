#include "scheduler/gate/batch_balancer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tessera {
namespace {

constexpr size_t kDecidedRounds = 256;  // rounds whose split is kept for workers still to ask
constexpr size_t kChangesKept = 20;

}  // namespace

BatchBalancer::BatchBalancer(const tessera::v1::JobSpec& job)
    : balance_(job.consistency().mode() == tessera::v1::ConsistencySpec::SYNC ? job.consistency().balance()
                                                                              : tessera::v1::ConsistencySpec::EQUAL),
      workers_(job.cluster().num_workers()),
      global_batch_(static_cast<int64_t>(job.batch_size()) * job.cluster().num_workers()),
      fixed_(job.consistency().shares().begin(), job.consistency().shares().end()),
      window_(workers_),
      samples_(workers_, 0.0),
      seconds_(workers_, 0.0),
      earlier_rates_(workers_, 0.0),
      steps_seen_(workers_, 0),
      examples_(workers_, 0),
      current_active_(workers_, true),
      in_job_(workers_, true) {
  current_ = Split(balance_ == tessera::v1::ConsistencySpec::FIXED ? fixed_ : std::vector<double>(workers_, 1.0),
                   current_active_);
}

void BatchBalancer::OnMembership(const MembershipEvent& event) {
  const int w = event.member.id;
  if (event.member.role != tessera::v1::WORKER || w < 0 || w >= workers_) return;
  absl::MutexLock lock(&mu_);
  switch (event.kind) {
    case MembershipEvent::kWorkerJoined:
    case MembershipEvent::kWorkerRejoined:
      in_job_[w] = true;
      break;
    case MembershipEvent::kWorkerDone:
    case MembershipEvent::kWorkerLost:
      in_job_[w] = false;
      break;
    default:
      break;
  }
}

BatchSlice BatchBalancer::SliceOf(int worker, int64_t round) {
  std::vector<bool> in_job;
  {
    absl::MutexLock lock(&mu_);
    in_job = in_job_;
  }
  return SliceOf(worker, round, in_job);
}

void BatchBalancer::Observe(int worker, int samples, double busy_seconds) {
  if (worker < 0 || worker >= workers_ || samples <= 0 || !(busy_seconds > 0) || !std::isfinite(busy_seconds)) return;
  absl::MutexLock lock(&mu_);
  examples_[worker] += samples;
  if (++steps_seen_[worker] <= kWarmupSteps) return;
  std::deque<std::pair<int, double>>& window = window_[worker];
  window.emplace_back(samples, busy_seconds);
  samples_[worker] += samples;
  seconds_[worker] += busy_seconds;
  // The oldest steps leave once the newer ones make up the window.
  while (window.size() > static_cast<size_t>(kWindowSteps) ||
         (window.size() > static_cast<size_t>(kMeasuredSteps) && seconds_[worker] - window.front().second >= kWindowSeconds)) {
    samples_[worker] -= window.front().first;
    seconds_[worker] -= window.front().second;
    window.pop_front();
  }
}

std::vector<double> BatchBalancer::RatesLocked() const {
  std::vector<double> rates(workers_, 0.0);
  for (int w = 0; w < workers_; ++w) rates[w] = !window_[w].empty() ? samples_[w] / seconds_[w] : earlier_rates_[w];
  return rates;
}

bool BatchBalancer::MeasuredLocked(const std::vector<bool>& active) const {
  // The first decision (off the equal split) comes after kMeasuredSteps; later ones once a whole window has
  // passed: kWindowSteps steps, or kWindowSeconds of compute on the busiest worker (in SYNC every worker takes a
  // step a round, so that much time has passed for all of them; a fast worker, mostly waiting, measures fewer
  // seconds of its own).
  bool window_passed = rebalances_ == 0;
  for (int w = 0; w < workers_; ++w) {
    if (!active[w]) continue;
    const size_t steps = window_[w].size();
    if (steps < static_cast<size_t>(kMeasuredSteps)) return false;
    window_passed |= steps >= static_cast<size_t>(kWindowSteps) || seconds_[w] >= kWindowSeconds;
  }
  return window_passed;
}

std::vector<int> BatchBalancer::Split(const std::vector<double>& weights, const std::vector<bool>& active) const {
  std::vector<int> split(workers_, 0);
  std::vector<int> members;
  double total = 0;
  for (int w = 0; w < workers_; ++w) {
    if (active[w]) {
      members.push_back(w);
      total += weights[w];
    }
  }
  if (members.empty() || global_batch_ < static_cast<int64_t>(members.size())) return split;
  // One example each, then the rest in proportion to the weights, by largest remainder.
  const int64_t rest = global_batch_ - static_cast<int64_t>(members.size());
  std::vector<std::pair<double, int>> remainders;
  int64_t given = 0;
  for (int w : members) {
    const double exact = total > 0 ? rest * weights[w] / total : static_cast<double>(rest) / members.size();
    const int64_t whole = static_cast<int64_t>(std::floor(exact));
    split[w] = 1 + static_cast<int>(whole);
    given += whole;
    remainders.emplace_back(exact - whole, -w);  // ties: the lower rank first
  }
  std::sort(remainders.rbegin(), remainders.rend());
  for (size_t i = 0; given < rest; ++i, ++given) ++split[-remainders[i % remainders.size()].second];
  return split;
}

std::vector<int> BatchBalancer::NextSplitLocked(const std::vector<bool>& active) {
  const bool members_changed = active != current_active_;
  if (balance_ != tessera::v1::ConsistencySpec::THROUGHPUT) {
    if (!members_changed) return current_;
    return Split(balance_ == tessera::v1::ConsistencySpec::FIXED ? fixed_ : std::vector<double>(workers_, 1.0), active);
  }
  // Unmeasured workers count as the mean of the measured ones (all equal before any measurement).
  const std::vector<double> rates = RatesLocked();
  double sum = 0;
  int measured = 0;
  for (int w = 0; w < workers_; ++w) {
    if (active[w] && rates[w] > 0) {
      sum += rates[w];
      ++measured;
    }
  }
  std::vector<double> weights(workers_, 1.0);
  for (int w = 0; w < workers_; ++w) weights[w] = rates[w] > 0 ? rates[w] : (measured > 0 ? sum / measured : 1.0);
  if (!MeasuredLocked(active)) return members_changed ? Split(weights, active) : current_;
  std::vector<int> target = Split(weights, active);
  if (members_changed) return target;
  // A round lasts as long as its slowest worker: share / throughput.
  auto round_seconds = [&](const std::vector<int>& split) {
    double longest = 0;
    for (int w = 0; w < workers_; ++w) {
      if (active[w]) longest = std::max(longest, split[w] / weights[w]);
    }
    return longest;
  };
  if (round_seconds(target) >= (1 - kHysteresis) * round_seconds(current_)) {
    unconfirmed_ = false;
    return current_;
  }
  // Off the equal split at once; later a gain is adopted only when a second window, measured afresh, predicts it
  // too (a window that was merely noisy rarely has a twin).
  if (rebalances_ == 0 || unconfirmed_) {
    unconfirmed_ = false;
    return target;
  }
  unconfirmed_ = true;
  ClearWindowsLocked();
  return current_;
}

void BatchBalancer::ClearWindowsLocked() {
  earlier_rates_ = RatesLocked();
  for (int w = 0; w < workers_; ++w) {
    window_[w].clear();
    samples_[w] = seconds_[w] = 0;
  }
}

BatchSlice BatchBalancer::SliceOf(int worker, int64_t round, const std::vector<bool>& active) {
  BatchSlice slice;
  std::vector<int> changed;  // the new split, when this round adopted one
  std::vector<double> rates;
  {
    absl::MutexLock lock(&mu_);
    auto it = decided_.find(round);
    if (it == decided_.end()) {
      std::vector<int> split = NextSplitLocked(active);
      if (split != current_) {
        ++rebalances_;
        changes_.emplace_back(round, split);
        if (changes_.size() > kChangesKept) changes_.pop_front();
        changed = split;
        rates = RatesLocked();
        ClearWindowsLocked();  // the next decision rests on steps measured under this split
      }
      current_ = split;
      current_active_ = active;
      it = decided_.emplace(round, std::move(split)).first;
      while (decided_.size() > kDecidedRounds) decided_.erase(decided_.begin());
    }
    if (worker >= 0 && worker < workers_) {
      const std::vector<int>& split = it->second;
      slice.offset = std::accumulate(split.begin(), split.begin() + worker, int64_t{0});
      slice.count = split[worker];
    }
  }
  if (!changed.empty() && on_rebalance_) on_rebalance_(round, changed, rates);
  return slice;
}

std::vector<int> BatchBalancer::Shares() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

std::vector<double> BatchBalancer::SamplesPerSecond() const {
  absl::MutexLock lock(&mu_);
  return RatesLocked();
}

nlohmann::json BatchBalancer::ToJson() const {
  absl::MutexLock lock(&mu_);
  nlohmann::json changes = nlohmann::json::array();
  for (const auto& [round, split] : changes_) changes.push_back({{"round", round}, {"shares", split}});
  return {{"mode", tessera::v1::ConsistencySpec::Balance_Name(balance_)},
          {"shares", current_},
          {"samples_per_sec", RatesLocked()},
          {"examples", examples_},
          {"rebalances", rebalances_},
          {"changes", changes}};
}

}  // namespace tessera
