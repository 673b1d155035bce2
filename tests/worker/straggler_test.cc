#include "worker/straggler.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

TEST(StragglerTest, ASlowDeviceTakesTheFactorTimesItsComputeFromItsStep) {
  StragglerOptions options;
  options.slow_factor = 4;
  options.delay_ms = 5;
  options.from_step = 10;
  Straggler straggler(options, 0);
  EXPECT_EQ(straggler.ExtraFor(9, absl::Milliseconds(10)), absl::ZeroDuration()) << "not slowed before its step";
  EXPECT_EQ(straggler.ExtraFor(10, absl::Milliseconds(10)), absl::Milliseconds(35));
}

// Stalls come with the asked-for probability, at the same steps for the same seed and rank, at other steps
// for another rank.
TEST(StragglerTest, StallsAreSeededAndComeWithTheirProbability) {
  StragglerOptions options;
  options.stall_probability = 0.1;
  options.stall_ms = 50;
  options.stall_seed = 7;
  Straggler a(options, 0), again(options, 0), other(options, 1);
  int stalls = 0, same = 0, shared = 0;
  for (int64_t clock = 0; clock < 20000; ++clock) {
    const bool stalled = a.ExtraFor(clock, absl::ZeroDuration()) == absl::Milliseconds(50);
    stalls += stalled;
    same += stalled == (again.ExtraFor(clock, absl::ZeroDuration()) > absl::ZeroDuration());
    shared += stalled && other.ExtraFor(clock, absl::ZeroDuration()) > absl::ZeroDuration();
  }
  EXPECT_NEAR(stalls / 20000.0, 0.1, 0.01);
  EXPECT_EQ(same, 20000);
  EXPECT_NEAR(shared / 20000.0, 0.01, 0.005) << "ranks stall independently";
}

TEST(StragglerTest, OptionsOutOfRangeNameTheirFlag) {
  StragglerOptions options;
  EXPECT_THAT(options.Validate(), IsOk());
  EXPECT_TRUE(options.ToFlags().empty());
  options.slow_factor = 0.5;
  EXPECT_THAT(options.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "--slow_factor"));
  options.slow_factor = 2;
  options.stall_probability = 1.5;
  EXPECT_THAT(options.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "--stall_probability"));
  options.stall_probability = 0.5;
  options.stall_ms = 20;
  EXPECT_EQ(options.ToFlags(), (std::vector<std::string>{"--slow_factor=2", "--stall_probability=0.5", "--stall_ms=20",
                                                          "--stall_seed=1"}));
}

}  // namespace
}  // namespace tessera
