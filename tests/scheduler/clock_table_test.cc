#include "scheduler/clock_table.h"

#include <optional>

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
  table.Advance(0, 3, Far(), [](absl::StatusOr<GateResult>) {});
  Gate back;
  table.Advance(0, 2, Far(), back.callback());
  EXPECT_THAT(back.result, StatusIs(absl::StatusCode::kInvalidArgument, "went back"));
}

}  // namespace
}  // namespace tessera
