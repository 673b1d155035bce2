#include "scheduler/gate/clock_table.h"

#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;

// Records what a gate answered, and whether it has answered.
struct Gate {
  absl::Notification answered;
  absl::StatusOr<GateResult> result = absl::UnknownError("no answer");

  ClockTable::Callback callback() {
    return [this](absl::StatusOr<GateResult> r) {
      result = std::move(r);
      answered.Notify();
    };
  }
};

absl::Time Far() { return absl::Now() + absl::Seconds(60); }

TEST(ClockTableTest, SyncHoldsTheFastWorkerUntilTheSlowOneCatchesUp) {
  ClockTable table(2, /*bound=*/0);
  Gate fast;
  table.Advance(0, 1, Far(), fast.callback());
  EXPECT_FALSE(fast.answered.HasBeenNotified());
  Gate slow;
  table.Advance(1, 1, Far(), slow.callback());
  ASSERT_TRUE(fast.answered.WaitForNotificationWithTimeout(absl::Seconds(10))) << "fast worker never released";
  ASSERT_TRUE(slow.answered.HasBeenNotified());
  EXPECT_EQ(fast.result->min_clock, 1);
}

// A checkpoint's hold two steps ahead lets every worker into the step before the cut (whose answers then name the
// cut: HeldAt) and holds them all before the cut itself, until Release.
TEST(ClockTableTest, AHoldTwoAheadLetsTheStepBeforeTheCutRunAndHoldsTheCut) {
  ClockTable table(2, /*bound=*/0);
  std::vector<Gate> first(2);
  for (int w = 0; w < 2; ++w) table.Advance(w, 1, Far(), first[w].callback());
  for (Gate& g : first) ASSERT_TRUE(g.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(table.HeldAt(), -1);
  EXPECT_EQ(table.Hold(/*ahead=*/2), 3);
  EXPECT_EQ(table.HeldAt(), 3);
  std::vector<Gate> before(2), cut(2);
  for (int w = 0; w < 2; ++w) table.Advance(w, 2, Far(), before[w].callback());
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(before[w].answered.WaitForNotificationWithTimeout(absl::Seconds(10))) << "worker " << w;
    EXPECT_TRUE(before[w].result.ok());
  }
  for (int w = 0; w < 2; ++w) table.Advance(w, 3, Far(), cut[w].callback());
  EXPECT_FALSE(cut[0].answered.WaitForNotificationWithTimeout(absl::Milliseconds(100))) << "the cut is held";
  table.Release();
  EXPECT_EQ(table.HeldAt(), -1);
  for (int w = 0; w < 2; ++w) EXPECT_TRUE(cut[w].answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST(ClockTableTest, SspLetsAWorkerRunAtMostBoundClocksAhead) {
  ClockTable table(2, /*bound=*/2);
  for (int64_t c = 1; c <= 2; ++c) {
    Gate g;
    table.Advance(0, c, Far(), g.callback());
    EXPECT_TRUE(g.answered.HasBeenNotified()) << "clock " << c << " is within the bound";
  }
  Gate third;
  table.Advance(0, 3, Far(), third.callback());
  EXPECT_FALSE(third.answered.HasBeenNotified()) << "clock 3 needs the slow worker at clock 1";
  Gate slow;
  table.Advance(1, 1, Far(), slow.callback());
  EXPECT_TRUE(third.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST(ClockTableTest, AsyncNeverWaits) {
  ClockTable table(2, /*bound=*/-1);
  Gate g;
  table.Advance(0, 100, Far(), g.callback());
  EXPECT_TRUE(g.answered.HasBeenNotified());
}

TEST(ClockTableTest, DoneWorkerNoLongerHoldsOthersBack) {
  ClockTable table(2, 0);
  Gate g;
  table.Advance(0, 1, Far(), g.callback());
  table.Done(1);
  EXPECT_TRUE(g.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST(ClockTableTest, StopReleasesWaitersWithStop) {
  ClockTable table(2, 0);
  Gate g;
  table.Advance(0, 1, Far(), g.callback());
  table.Stop("target reached");
  ASSERT_TRUE(g.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(g.result->stop);
  EXPECT_EQ(g.result->stop_reason, "target reached");
}

TEST(ClockTableTest, DeadlineNamesTheStraggler) {
  ClockTable table(3, 0);
  table.Advance(2, 1, Far(), [](absl::StatusOr<GateResult>) {});
  Gate g;
  table.Advance(0, 1, absl::Now() + absl::Milliseconds(50), g.callback());
  ASSERT_TRUE(g.answered.WaitForNotificationWithTimeout(absl::Seconds(10))) << "deadline never fired";
  EXPECT_THAT(g.result, StatusIs(absl::StatusCode::kDeadlineExceeded, "worker 1 at clock 0"));
}

TEST(ClockTableTest, RejectsBadWorkerAndBackwardClock) {
  ClockTable table(1, -1);
  Gate bad;
  table.Advance(5, 1, Far(), bad.callback());
  EXPECT_THAT(bad.result, StatusIs(absl::StatusCode::kInvalidArgument, "worker id 5"));
  for (int clock = 1; clock <= 3; ++clock) table.Advance(0, clock, Far(), [](absl::StatusOr<GateResult>) {});
  Gate back;
  table.Advance(0, 2, Far(), back.callback());
  EXPECT_THAT(back.result, StatusIs(absl::StatusCode::kInvalidArgument, "went back"));
}

// Backup workers (3 workers, 1 backup): the first two to finish a round make it; the gate opens for them at
// once, and the third, arriving afterwards, is late and sent on to the others' round.
TEST(ClockTableTest, BackupWorkersDecideEachRoundOnceAndSendTheLateWorkerOn) {
  std::vector<RoundMembers> decided;
  absl::Mutex mu;
  ClockTable table(3, /*bound=*/0, /*backups=*/1, [&](const RoundMembers& r) {
    absl::MutexLock lock(&mu);
    decided.push_back(r);
  });
  Gate first, second, third;
  table.Advance(0, 1, Far(), first.callback());
  EXPECT_FALSE(first.answered.HasBeenNotified());
  table.Advance(1, 1, Far(), second.callback());
  ASSERT_TRUE(first.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(second.answered.HasBeenNotified());
  EXPECT_FALSE(first.result->late_next_clock.has_value());
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(decided.size(), 1u);
    EXPECT_EQ(decided[0].round, 0);
    EXPECT_EQ(decided[0].members, (std::vector<int>{0, 1}));
    EXPECT_EQ(decided[0].late, (std::vector<int>{2}));
  }
  // The two go on to round 1 and finish it before the third finishes round 0.
  Gate a, b;
  table.Advance(0, 2, Far(), a.callback());
  table.Advance(1, 2, Far(), b.callback());
  ASSERT_TRUE(a.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  table.Advance(2, 1, Far(), third.callback());
  ASSERT_TRUE(third.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_THAT(third.result, ::tessera::testing::IsOk());
  EXPECT_EQ(third.result->late_next_clock, std::optional<int64_t>(2)) << "on to the round after the newest decided";
  EXPECT_EQ(table.LateRounds(), (std::vector<int64_t>{0, 0, 1}));
  ASSERT_EQ(table.RecentRounds().size(), 2u);
}

// A worker that is late in every round never holds a round back and is counted each time.
TEST(ClockTableTest, BackupWorkersAWorkerLateInEveryRoundNeverHoldsTheOthers) {
  ClockTable table(3, /*bound=*/0, /*backups=*/1);
  int64_t slow_clock = 1;
  for (int64_t round = 0; round < 20; ++round) {
    Gate a, b;
    table.Advance(0, round + 1, Far(), a.callback());
    table.Advance(1, round + 1, Far(), b.callback());
    ASSERT_TRUE(a.answered.WaitForNotificationWithTimeout(absl::Seconds(10))) << "round " << round;
    ASSERT_TRUE(b.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
    if (round % 4 == 3) {  // the slow one finishes a step now and then, always after the others
      Gate slow;
      table.Advance(2, slow_clock, Far(), slow.callback());
      ASSERT_TRUE(slow.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
      ASSERT_TRUE(slow.result.ok());
      ASSERT_TRUE(slow.result->late_next_clock.has_value());
      EXPECT_EQ(*slow.result->late_next_clock, round + 1);
      slow_clock = *slow.result->late_next_clock + 1;
    }
  }
  EXPECT_EQ(table.LateRounds()[2], 5);
  for (const RoundMembers& r : table.RecentRounds()) EXPECT_EQ(r.members, (std::vector<int>{0, 1}));
}

// A restarted scheduler's table decides the rounds again from the clocks the workers come back with. Worker 1
// was late for round 802 (sent on to 803, it never pushed 802), and the decision {0} was lost with the old
// scheduler: coming back at clock 803 having pushed nothing before it, worker 1 is no member of round 802 (the
// servers would wait for its gradient forever), while worker 0, which pushed every round, is.
TEST(ClockTableTest, BackupWorkersARejoinedWorkerIsNoMemberOfTheRoundsItSkipped) {
  std::vector<RoundMembers> decided;
  absl::Mutex mu;
  ClockTable table(2, /*bound=*/0, /*backups=*/1, [&](const RoundMembers& r) {
    absl::MutexLock lock(&mu);
    decided.push_back(r);
  });
  table.Rejoin(0, 803, /*pushed_from=*/0);
  table.Rejoin(1, 803, /*pushed_from=*/803);
  Gate a;
  table.Advance(0, 804, Far(), a.callback());
  ASSERT_TRUE(a.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_THAT(a.result, ::tessera::testing::IsOk());
  EXPECT_FALSE(a.result->late_next_clock.has_value());
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(decided.size(), 804u) << "rounds 0..803 decided";
    for (const RoundMembers& r : decided) {
      EXPECT_EQ(r.members, (std::vector<int>{0})) << "round " << r.round;
      EXPECT_EQ(r.late, (std::vector<int>{1})) << "round " << r.round;
    }
    EXPECT_EQ(decided[802].round, 802);
  }
  bool found = false;
  for (const RoundMembers& r : table.RecentRounds()) {
    if (r.round != 802) continue;
    found = true;
    EXPECT_EQ(r.members, (std::vector<int>{0}));
    EXPECT_EQ(r.late, (std::vector<int>{1}));
  }
  EXPECT_TRUE(found) << "round 802 among the recent rounds";
  // Worker 1 finishes round 803, decided without it: late, on to the round after the newest decided.
  Gate b;
  table.Advance(1, 804, Far(), b.callback());
  ASSERT_TRUE(b.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_THAT(b.result, ::tessera::testing::IsOk());
  EXPECT_EQ(b.result->late_next_clock, std::optional<int64_t>(804));
}

// A worker that does not say from which clock it pushed (pushed_from 0, an older worker) counts as having pushed
// every round before its clock, as before.
TEST(ClockTableTest, BackupWorkersARejoinedWorkerWithoutPushedFromIsAMemberOfEveryEarlierRound) {
  std::vector<RoundMembers> decided;
  absl::Mutex mu;
  ClockTable table(2, /*bound=*/0, /*backups=*/1, [&](const RoundMembers& r) {
    absl::MutexLock lock(&mu);
    decided.push_back(r);
  });
  table.Rejoin(0, 3, /*pushed_from=*/0);
  table.Rejoin(1, 3, /*pushed_from=*/0);
  Gate a;
  table.Advance(0, 4, Far(), a.callback());
  ASSERT_TRUE(a.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::MutexLock lock(&mu);
  ASSERT_EQ(decided.size(), 4u);
  for (size_t round = 0; round < 3; ++round) {
    EXPECT_EQ(decided[round].members, (std::vector<int>{0, 1})) << "round " << round;
  }
  EXPECT_EQ(decided[3].members, (std::vector<int>{0})) << "worker 1 has not finished round 3";
}

// A rollback while workers are anywhere in their step: one waiting is told at once, one that advances from
// before it (any clock, as far ahead as it got) is told instead of refused, and each goes on from the rollback's
// clock once the servers are restored (Release). Afterwards the one-step rule holds again.
TEST(ClockTableTest, ARollbackNeverFailsAWorkerThatHadNotHeardOfIt) {
  ClockTable table(3, /*bound=*/0);
  for (int64_t c = 1; c <= 5; ++c) {
    std::vector<Gate> gates(3);
    for (int w = 0; w < 3; ++w) table.Advance(w, c, Far(), gates[w].callback());
    for (Gate& g : gates) ASSERT_TRUE(g.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  Gate waiting;  // worker 0 waits at the gate of step 6
  table.Advance(0, 6, Far(), waiting.callback());
  table.RollBack(2, /*generation=*/1);
  ASSERT_TRUE(waiting.answered.HasBeenNotified());
  ASSERT_TRUE(waiting.result.ok()) << waiting.result.status();
  EXPECT_EQ(waiting.result->rolled_back_to, 2);
  EXPECT_EQ(waiting.result->rollback_generation, 1u);

  // Workers 1 and 2 were mid-step: they advance from where they were, 6 (one ahead) and 5 (the same clock again).
  for (const auto& [worker, clock] : std::vector<std::pair<int, int64_t>>{{1, 6}, {2, 5}}) {
    Gate stale;
    table.Advance(worker, clock, Far(), stale.callback());
    ASSERT_TRUE(stale.answered.HasBeenNotified());
    ASSERT_TRUE(stale.result.ok()) << "worker " << worker << " refused: " << stale.result.status();
    EXPECT_EQ(stale.result->rolled_back_to, 2);
    EXPECT_EQ(stale.result->rollback_generation, 1u);
  }
  // Every worker goes on from the rollback's clock; held until the servers are restored.
  std::vector<Gate> after(3);
  for (int w = 0; w < 3; ++w) table.Advance(w, 3, Far(), after[w].callback());
  for (Gate& g : after) EXPECT_FALSE(g.answered.HasBeenNotified()) << "gate opened before the restore";
  table.Release();
  for (Gate& g : after) {
    ASSERT_TRUE(g.answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
    ASSERT_TRUE(g.result.ok()) << g.result.status();
    EXPECT_FALSE(g.result->rolled_back_to.has_value());
  }
  Gate jump;
  table.Advance(1, 9, Far(), jump.callback());
  ASSERT_TRUE(jump.answered.HasBeenNotified());
  EXPECT_THAT(jump.result.status(), StatusIs(absl::StatusCode::kInvalidArgument, "jumped"));
}

}  // namespace
}  // namespace tessera
