#include "scheduler/gate/batch_balancer.h"

#include <numeric>
#include <random>

#include "gtest/gtest.h"

namespace tessera {
namespace {

tessera::v1::JobSpec Job(int workers, int batch, tessera::v1::ConsistencySpec::Balance balance,
                         std::vector<float> shares = {}) {
  tessera::v1::JobSpec job;
  job.set_batch_size(batch);
  job.mutable_cluster()->set_num_workers(workers);
  job.mutable_consistency()->set_mode(tessera::v1::ConsistencySpec::SYNC);
  job.mutable_consistency()->set_balance(balance);
  for (float s : shares) job.mutable_consistency()->add_shares(s);
  return job;
}

// The slices of one round: contiguous in rank order, covering the global batch exactly.
std::vector<int> Round(BatchBalancer& balancer, int64_t round, const std::vector<bool>& active, int global) {
  std::vector<int> counts;
  int64_t offset = 0;
  for (size_t w = 0; w < active.size(); ++w) {
    const BatchSlice slice = balancer.SliceOf(static_cast<int>(w), round, active);
    EXPECT_EQ(slice.offset, offset) << "worker " << w << " round " << round;
    offset += slice.count;
    counts.push_back(slice.count);
  }
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0), global) << "round " << round;
  return counts;
}

// Simulated devices: worker w computes `rate[w]` examples per second, with +-noise, for `rounds` rounds of
// `batch` examples per worker.
void Simulate(BatchBalancer& balancer, const std::vector<double>& rate, int64_t first, int64_t rounds, double noise,
              std::mt19937& rng, const std::vector<bool>& active, int batch = 32) {
  std::uniform_real_distribution<double> jitter(1 - noise, 1 + noise);
  for (int64_t r = first; r < first + rounds; ++r) {
    std::vector<int> counts = Round(balancer, r, active, batch * static_cast<int>(active.size()));
    for (size_t w = 0; w < rate.size(); ++w) {
      if (active[w] && counts[w] > 0) balancer.Observe(static_cast<int>(w), counts[w], counts[w] / rate[w] * jitter(rng));
    }
  }
}

TEST(BatchBalancerTest, EqualGivesEveryWorkerItsBatchInRankOrder) {
  BatchBalancer balancer(Job(4, 32, tessera::v1::ConsistencySpec::EQUAL));
  EXPECT_FALSE(balancer.enabled());
  EXPECT_EQ(Round(balancer, 0, {true, true, true, true}, 128), (std::vector<int>{32, 32, 32, 32}));
}

TEST(BatchBalancerTest, FixedSharesSplitInProportion) {
  BatchBalancer balancer(Job(2, 32, tessera::v1::ConsistencySpec::FIXED, {3, 1}));
  EXPECT_EQ(Round(balancer, 0, {true, true}, 64), (std::vector<int>{48, 16}));
}

// A GPU beside a CPU worker (simulated speeds, 20x apart): the CPU ends with a small share, and the predicted
// round time (slowest share / speed) is close to the best split's.
TEST(BatchBalancerTest, ThroughputGivesASlowCpuWorkerASmallShare) {
  BatchBalancer balancer(Job(2, 32, tessera::v1::ConsistencySpec::THROUGHPUT));
  std::mt19937 rng(1);
  Simulate(balancer, {20000, 1000}, 0, 100, 0.05, rng, {true, true});
  const std::vector<int> shares = balancer.Shares();
  EXPECT_GE(shares[0], 58);
  EXPECT_LE(shares[1], 6);
  EXPECT_GE(shares[1], 1) << "every active worker keeps at least one example";
}

// Equal devices with noisy measurements: shares do not flap.
TEST(BatchBalancerTest, NoiseDoesNotMakeSharesFlap) {
  BatchBalancer balancer(Job(4, 32, tessera::v1::ConsistencySpec::THROUGHPUT));
  std::mt19937 rng(2);
  Simulate(balancer, {5000, 5000, 5000, 5000}, 0, 500, 0.15, rng, {true, true, true, true});
  EXPECT_LE(balancer.ToJson()["rebalances"].get<int>(), 2);
}

// A worker slowed 4x in the middle of a run: its share follows within two windows of measurement (a decision
// on a window partly measured before the change, then one measured after it), and comes back when it recovers.
// Here a step of an equal share takes 8 ms, so a window (kWindowSeconds of compute) is about 125 rounds.
TEST(BatchBalancerTest, SharesFollowAWorkerSlowedInTheMiddleOfARun) {
  BatchBalancer balancer(Job(2, 32, tessera::v1::ConsistencySpec::THROUGHPUT));
  std::mt19937 rng(3);
  Simulate(balancer, {4000, 4000}, 0, 300, 0.05, rng, {true, true});
  std::vector<int> shares = balancer.Shares();
  EXPECT_NEAR(shares[0], 32, 4);
  Simulate(balancer, {4000, 1000}, 300, 300, 0.05, rng, {true, true});
  shares = balancer.Shares();
  EXPECT_NEAR(shares[1], 64 / 5.0, 3) << "1/5 of the round for the worker at 1/4 of the speed";
  Simulate(balancer, {4000, 4000}, 600, 300, 0.05, rng, {true, true});
  shares = balancer.Shares();
  EXPECT_NEAR(shares[1], 32, 4);
}

// Four unequal workers measured with 20% noise per step, for 2000 rounds: the shares settle within a few
// windows, and after that they never turn back and forth (a share that grows and then shrinks again, or the
// reverse, by more than 2% of the global batch each time).
TEST(BatchBalancerTest, SharesSettleAndDoNotOscillateUnderNoise) {
  BatchBalancer balancer(Job(4, 256, tessera::v1::ConsistencySpec::THROUGHPUT));
  std::mt19937 rng(4);
  std::vector<std::vector<int>> history;
  const std::vector<bool> all = {true, true, true, true};
  const std::vector<double> rate = {40000, 40000, 10000, 10000};
  for (int64_t r = 0; r < 2000; ++r) {
    Simulate(balancer, rate, r, 1, 0.2, rng, all, 256);
    if (history.empty() || balancer.Shares() != history.back()) history.push_back(balancer.Shares());
  }
  const std::vector<int> final_shares = balancer.Shares();
  EXPECT_NEAR(final_shares[2], 1024 / 10.0, 1024 * 0.03) << "a tenth of the round for a worker at a quarter";
  EXPECT_LE(history.size(), 12u) << "changes, the first split included";
  const int band = 1024 * 2 / 100;
  for (int w = 0; w < 4; ++w) {
    std::vector<int> moves;
    for (size_t i = 1; i < history.size(); ++i) {
      const int move = history[i][w] - history[i - 1][w];
      if (std::abs(move) > band) moves.push_back(move);
    }
    for (size_t i = 1; i < moves.size(); ++i) {
      EXPECT_EQ(moves[i] > 0, moves[i - 1] > 0) << "worker " << w << " turned: " << moves[i - 1] << " then " << moves[i];
    }
  }
}

// A worker that left gets nothing; the others take the whole global batch. Every worker of a round sees the
// split decided when the round was first asked for.
TEST(BatchBalancerTest, ARoundKeepsItsSplitAndALostWorkerGetsNothing) {
  BatchBalancer balancer(Job(3, 32, tessera::v1::ConsistencySpec::EQUAL));
  const BatchSlice before = balancer.SliceOf(2, 5, {true, true, true});
  EXPECT_EQ(before.count, 32);
  EXPECT_EQ(balancer.SliceOf(2, 5, {true, true, false}).count, 32) << "round 5 was decided already";
  EXPECT_EQ(balancer.SliceOf(2, 6, {true, true, false}).count, 0);
  EXPECT_EQ(balancer.SliceOf(0, 6, {true, true, false}).count + balancer.SliceOf(1, 6, {true, true, false}).count, 96);
}

// The balancer hears from the cluster view who is in the job: a worker lost leaves the split from the next
// undecided round, and is back in it once it rejoins.
TEST(BatchBalancerTest, MembershipEventsSayWhoSharesTheBatch) {
  BatchBalancer balancer(Job(3, 32, tessera::v1::ConsistencySpec::EQUAL));
  EXPECT_EQ(balancer.SliceOf(2, 5).count, 32);
  MembershipEvent event;
  event.kind = MembershipEvent::kWorkerLost;
  event.member.role = tessera::v1::WORKER;
  event.member.id = 2;
  balancer.OnMembership(event);
  EXPECT_EQ(balancer.SliceOf(2, 5).count, 32) << "round 5 was decided already";
  EXPECT_EQ(balancer.SliceOf(2, 6).count, 0);
  EXPECT_EQ(balancer.SliceOf(0, 6).count + balancer.SliceOf(1, 6).count, 96);
  event.kind = MembershipEvent::kWorkerRejoined;
  balancer.OnMembership(event);
  EXPECT_EQ(balancer.SliceOf(2, 7).count, 32);
}

}  // namespace
}  // namespace tessera
