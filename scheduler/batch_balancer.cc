#include "scheduler/batch_balancer.h"

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
      samples_(workers_, 0.0),
      seconds_(workers_, 0.0),
      steps_seen_(workers_, 0),
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
  if (++steps_seen_[worker] <= kWarmupSteps) return;
  if (seconds_[worker] > 0) {
    samples_[worker] = (1 - kSmoothing) * samples_[worker] + kSmoothing * samples;
    seconds_[worker] = (1 - kSmoothing) * seconds_[worker] + kSmoothing * busy_seconds;
  } else {
    samples_[worker] = samples;
    seconds_[worker] = busy_seconds;
  }
}

std::vector<double> BatchBalancer::RatesLocked() const {
  std::vector<double> rates(workers_, 0.0);
  for (int w = 0; w < workers_; ++w) rates[w] = seconds_[w] > 0 ? samples_[w] / seconds_[w] : 0.0;
  return rates;
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
  for (int w = 0; w < workers_; ++w) {
    if (active[w] && steps_seen_[w] < kWarmupSteps + kMeasuredSteps) return members_changed ? Split(weights, active) : current_;
  }
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
  return round_seconds(target) < (1 - kHysteresis) * round_seconds(current_) ? target : current_;
}

BatchSlice BatchBalancer::SliceOf(int worker, int64_t round, const std::vector<bool>& active) {
  absl::MutexLock lock(&mu_);
  auto it = decided_.find(round);
  if (it == decided_.end()) {
    std::vector<int> split = NextSplitLocked(active);
    if (split != current_) {
      ++rebalances_;
      changes_.emplace_back(round, split);
      if (changes_.size() > kChangesKept) changes_.pop_front();
    }
    current_ = split;
    current_active_ = active;
    it = decided_.emplace(round, std::move(split)).first;
    while (decided_.size() > kDecidedRounds) decided_.erase(decided_.begin());
  }
  BatchSlice slice;
  if (worker < 0 || worker >= workers_) return slice;
  const std::vector<int>& split = it->second;
  slice.offset = std::accumulate(split.begin(), split.begin() + worker, int64_t{0});
  slice.count = split[worker];
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
          {"rebalances", rebalances_},
          {"changes", changes}};
}

}  // namespace tessera
