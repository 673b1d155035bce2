// How a SYNC round's global batch (batch_size * num_workers examples) is split across the workers
// (ConsistencySpec.balance): equally, by hand (FIXED shares), or in proportion to each worker's measured samples
// per second of compute (THROUGHPUT), so that a round ends at about the same time on every worker.
//
// Workers measure each step's compute (forward, backward, and any slowdown; not the waits for values) and send
// it with their next clock. A worker's throughput is its examples over its compute seconds in its latest steps:
// as many as make up kWindowSeconds of compute (at least kMeasuredSteps, at most kWindowSteps), leaving out its
// first kWarmupSteps. A window of time rather than of steps gives a device that is throttled in bursts (a CPU
// quota, a GPU shared in time slices) a fair measure however short its steps.
//
// A round's split is decided the first time any worker asks for it and kept, so every worker of a round sees the
// same split: slices in rank order, covering the global batch exactly, at least one example per active worker.
// THROUGHPUT leaves the equal split once every worker has kMeasuredSteps measured steps, and adopts a new split
// only when it is predicted to shorten a round (the slowest worker's share / throughput) by more than
// kHysteresis in two windows in a row (each measured afresh), or at once when workers came or went. Each
// decision rests on steps measured under the split in force:
// a new split empties the windows, and the next decision waits until a whole window has passed under it
// (kWindowSteps steps, or kWindowSeconds of compute on the busiest worker). A device's speed per example depends on its share (fixed
// costs per step weigh more on a small share), so measurements under an earlier split would mislead; and noise
// must beat the hysteresis with a whole window, not a few steps. So shares do not flap, and a device that slows
// down is followed within about a window of its compute.
#ifndef TESSERA_SCHEDULER_GATE_BATCH_BALANCER_H_
#define TESSERA_SCHEDULER_GATE_BATCH_BALANCER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/base/batch_slice.h"
#include "nlohmann/json.hpp"
#include "proto/job.pb.h"
#include "scheduler/membership/membership_events.h"

namespace tessera {

// Thread-safe.
class BatchBalancer {
 public:
  static constexpr double kHysteresis = 0.10;  // a new split must shorten the predicted round by this much
  static constexpr double kWindowSeconds = 1.0;   // a worker's throughput is measured over this much compute
  static constexpr int kWindowSteps = 128;       // and at most this many steps
  static constexpr int kWarmupSteps = 2;       // a worker's first steps (one-time costs) are not measured
  static constexpr int kMeasuredSteps = 5;     // THROUGHPUT moves off an equal split once every worker has these

  // `job` must be validated.
  explicit BatchBalancer(const tessera::v1::JobSpec& job);

  // False for EQUAL (and for ASYNC and SSP): every worker takes batch_size examples at its own offset.
  bool enabled() const { return balance_ != tessera::v1::ConsistencySpec::EQUAL; }

  // `worker` computed `samples` examples in `busy_seconds`. Ignored unless both are > 0.
  void Observe(int worker, int samples, double busy_seconds);

  // The slice of `worker` in round `round`, deciding the round's split over the workers `active` says are in
  // the job when nobody asked for that round yet. A worker not active gets count 0.
  BatchSlice SliceOf(int worker, int64_t round, const std::vector<bool>& active);
  // The same over the workers in the job as the membership events said: every rank but those lost or done.
  BatchSlice SliceOf(int worker, int64_t round);

  // Called (outside the balancer's lock) with each new split as a round adopts it, and the measured samples per
  // second it was made from; set before the balancer is used.
  using RebalanceListener =
      std::function<void(int64_t round, const std::vector<int>& shares, const std::vector<double>& samples_per_sec)>;
  void SetRebalanceListener(RebalanceListener listener) { on_rebalance_ = std::move(listener); }

  // Subscribed to the cluster view: a worker lost or done leaves the split, one that joins or rejoins is in it.
  void OnMembership(const MembershipEvent& event);

  // Examples per round of every worker under the newest split, and the measured samples per second (0: none).
  std::vector<int> Shares() const;
  std::vector<double> SamplesPerSecond() const;
  // {"mode", "shares", "samples_per_sec", "examples" (each worker's, in every mode), "rebalances",
  // "changes": [{"round", "shares"}...]} (last changes).
  nlohmann::json ToJson() const;

 private:
  // The split of the global batch in proportion to `weights` over the active workers.
  std::vector<int> Split(const std::vector<double>& weights, const std::vector<bool>& active) const;
  std::vector<int> NextSplitLocked(const std::vector<bool>& active) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<double> RatesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empties every worker's window (keeping its rate for display until it measures again).
  void ClearWindowsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every active worker has measured enough under the split in force for a decision.
  bool MeasuredLocked(const std::vector<bool>& active) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const tessera::v1::ConsistencySpec::Balance balance_;
  const int workers_;
  const int64_t global_batch_;
  const std::vector<double> fixed_;  // FIXED: the job's shares
  RebalanceListener on_rebalance_;

  mutable absl::Mutex mu_;
  // Each worker's measured steps (examples, busy seconds) in its window, oldest first, and their sums.
  std::vector<std::deque<std::pair<int, double>>> window_ ABSL_GUARDED_BY(mu_);
  std::vector<double> samples_ ABSL_GUARDED_BY(mu_);
  std::vector<double> seconds_ ABSL_GUARDED_BY(mu_);
  bool unconfirmed_ ABSL_GUARDED_BY(mu_) = false;  // the last window predicted a gain; the next must confirm it
  std::vector<double> earlier_rates_ ABSL_GUARDED_BY(mu_);  // the rates the last split was made from (shown until
                                                             // a worker measures again)
  std::vector<int> steps_seen_ ABSL_GUARDED_BY(mu_);  // observations per worker, warm-up included
  std::vector<int64_t> examples_ ABSL_GUARDED_BY(mu_);  // examples each worker computed, warm-up included
  std::vector<int> current_ ABSL_GUARDED_BY(mu_);  // the newest split
  std::vector<bool> current_active_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::vector<int>> decided_ ABSL_GUARDED_BY(mu_);  // recent rounds' splits
  int64_t rebalances_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::pair<int64_t, std::vector<int>>> changes_ ABSL_GUARDED_BY(mu_);  // (round, split), newest last
  std::vector<bool> in_job_ ABSL_GUARDED_BY(mu_);  // by the membership events; every rank until it leaves
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_GATE_BATCH_BALANCER_H_
