#include "scheduler/membership.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;

tessera::v1::RegisterRequest Server(const std::string& address) {
  tessera::v1::RegisterRequest r;
  r.set_role(tessera::v1::SERVER);
  r.set_address(address);
  return r;
}

TEST(MembershipTest, WaitingSummaryNamesWhoIsMissingAndWhenEachMemberWasLastHeard) {
  Membership members(/*num_servers=*/2, /*num_workers=*/2);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_EQ(members.WaitingSummary(t0, absl::Seconds(10)), "waiting for 2 more servers and 2 more workers");
  ASSERT_THAT(members.Add(Server("node7:4100"), t0).status(), IsOk());
  tessera::v1::RegisterRequest worker;
  worker.set_role(tessera::v1::WORKER);
  worker.set_hostname("gpu3");
  ASSERT_THAT(members.Add(worker, t0 + absl::Seconds(30)).status(), IsOk());
  EXPECT_EQ(members.WaitingSummary(t0 + absl::Seconds(34), absl::Seconds(10)),
            "waiting for 1 more server and 1 more worker; server 0 at node7:4100 lost, last heard 34 s ago; "
            "worker 0 on gpu3 last heard 4 s ago");
  ASSERT_THAT(members.Touch(tessera::v1::SERVER, 0, t0 + absl::Seconds(33)), IsOk());
  EXPECT_NE(members.WaitingSummary(t0 + absl::Seconds(34), absl::Seconds(10)).find("server 0 at node7:4100 last heard 1 s ago"),
            std::string::npos);
  ASSERT_THAT(members.Add(Server("node8:4100"), t0).status(), IsOk());
  ASSERT_THAT(members.Add(worker, t0).status(), IsOk());
  EXPECT_EQ(members.WaitingSummary(t0, absl::Seconds(10)), "") << "nobody is missing";
}

}  // namespace
}  // namespace tessera
