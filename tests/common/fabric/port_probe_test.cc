// PortProbe: a port something listens on answers OK; a port nothing listens on any more is UNAVAILABLE; a
// probe never blocks and starts at most once per interval.
#include "common/fabric/port_probe.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/ports.h"
#include "tests/testing/status_matchers.h"

namespace tessera::testing {
namespace {

// Polls until a verdict comes, at most 2 s.
absl::Status VerdictOf(PortProbe& probe) {
  const absl::Time until = absl::Now() + absl::Seconds(2);
  while (absl::Now() < until) {
    if (std::optional<absl::Status> v = probe.Poll(absl::Now(), absl::Milliseconds(10))) return *v;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::DeadlineExceededError("no verdict within 2 s");
}

TEST(PortProbeTest, APortThatListensIsThereAndOneClosedSinceIsGone) {
  int port = 0;
  const int listening = ListeningLoopbackSocket(&port);
  absl::StatusOr<SocketAddress> address = ResolveHostPort(absl::StrCat("127.0.0.1:", port));
  ASSERT_THAT(address, IsOk());
  PortProbe probe(*address);
  EXPECT_THAT(VerdictOf(probe), IsOk());
  close(listening);  // the process that listened is gone
  EXPECT_THAT(VerdictOf(probe), StatusIs(absl::StatusCode::kUnavailable, "nothing listens"));
}

TEST(PortProbeTest, AProbeStartsAtMostOncePerInterval) {
  int port = 0;
  const int listening = ListeningLoopbackSocket(&port);
  close(listening);
  PortProbe probe(*ResolveHostPort(absl::StrCat("127.0.0.1:", port)));
  const absl::Time start = absl::Now();
  std::optional<absl::Status> first;
  for (int i = 0; i < 2000 && !first; ++i) {
    first = probe.Poll(start, absl::Hours(1));
    if (!first) absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(first.has_value()) << "no verdict from a closed loopback port";
  EXPECT_THAT(*first, StatusIs(absl::StatusCode::kUnavailable, "nothing listens"));
  EXPECT_FALSE(probe.Poll(start + absl::Minutes(1), absl::Hours(1)).has_value()) << "probed again within the interval";
}

TEST(PortProbeTest, AnUnparsableAddressIsRefused) {
  EXPECT_THAT(ResolveHostPort("no-port-here"), StatusIs(absl::StatusCode::kInvalidArgument, ""));
}

}  // namespace
}  // namespace tessera::testing
