#include "scheduler/membership/failure_detector.h"

#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/testing/registrations.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;

using ::tessera::testing::JoinAnswered;
using ::tessera::testing::ServerRegistration;
using ::tessera::testing::WorkerRegistration;

// A member silent for the timeout is declared lost once, and only it; one that heartbeats stays.
TEST(FailureDetectorTest, DeclaresLostExactlyTheMembersSilentForTheTimeoutAndEachOnce) {
  ClusterView view(/*num_servers=*/1, /*num_workers=*/2);
  const absl::Time t0 = absl::FromUnixSeconds(5000);
  ASSERT_THAT(JoinAnswered(view, ServerRegistration("s:1"), t0).status(), IsOk());
  ASSERT_THAT(JoinAnswered(view, WorkerRegistration("a"), t0).status(), IsOk());
  ASSERT_THAT(JoinAnswered(view, WorkerRegistration("b"), t0).status(), IsOk());
  std::vector<std::string> lost;
  FailureDetector detector(&view, absl::Seconds(10), [&](const Member& m) { lost.push_back(m.Describe()); });

  ASSERT_THAT(view.Touch(tessera::v1::SERVER, 0, 1, t0 + absl::Seconds(8)), IsOk());
  ASSERT_THAT(view.Touch(tessera::v1::WORKER, 0, 1, t0 + absl::Seconds(8)), IsOk());
  detector.Check(t0 + absl::Seconds(9));
  EXPECT_TRUE(lost.empty()) << "nobody has been silent for 10 s yet";

  detector.Check(t0 + absl::Seconds(11));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0], "worker 1 on b");

  detector.Check(t0 + absl::Seconds(12));
  EXPECT_EQ(lost.size(), 1u) << "a member is declared lost once";

  detector.Check(t0 + absl::Seconds(19));
  ASSERT_EQ(lost.size(), 3u) << "the others' last heartbeat was at 8 s";
  EXPECT_EQ(lost[1], "server 0 at s:1");
  EXPECT_EQ(lost[2], "worker 0 on a");
  EXPECT_EQ(detector.timeout(), absl::Seconds(10));
}

// Started, the detector checks on a thread of its own at its interval; Stop returns once no check runs.
TEST(FailureDetectorTest, StartedItChecksOnItsOwnThreadUntilStopped) {
  ClusterView view(1, 1);
  // Joined long ago on the clock Start uses (absl::Now): silent far past the timeout at the first check.
  const absl::Time long_ago = absl::Now() - absl::Hours(1);
  ASSERT_THAT(JoinAnswered(view, WorkerRegistration("a"), long_ago).status(), IsOk());
  absl::Notification declared;
  absl::Mutex mu;
  int calls = 0;
  FailureDetector detector(&view, absl::Seconds(10), [&](const Member&) {
    absl::MutexLock lock(&mu);
    if (++calls == 1) declared.Notify();
  });
  detector.Start(absl::Milliseconds(20));
  ASSERT_TRUE(declared.WaitForNotificationWithTimeout(absl::Seconds(10)));
  detector.Stop();
  detector.Stop();  // idempotent
  absl::MutexLock lock(&mu);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace tessera
