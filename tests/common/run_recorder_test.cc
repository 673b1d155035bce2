#include "common/run_recorder.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(SummaryLineTest, SaysTheOutcomeInWordsWithTheStopReason) {
  nlohmann::json summary = {{"completed", true},          {"wall_seconds", 7.21},       {"steps", 722},
                            {"epochs", 1.5423},           {"test_accuracy", 0.86141},   {"target_accuracy", 0.85},
                            {"seconds_to_target", 7.061}, {"stop_reason", "test accuracy 0.8559 reached the target"}};
  EXPECT_EQ(SummaryLine(summary),
            "summary: completed in 7.2 s, 722 steps (1.54 epochs), test accuracy 0.8614 (0.85 reached after 7.06 s); "
            "stop: test accuracy 0.8559 reached the target");
}

TEST(SummaryLineTest, ARunThatNeverEvaluatedOrReachedItsTargetSaysOnlyWhatItKnows) {
  nlohmann::json summary = {{"completed", false},       {"wall_seconds", 3.0},      {"steps", 0},
                            {"epochs", nullptr},        {"test_accuracy", nullptr}, {"target_accuracy", 0.85},
                            {"seconds_to_target", nullptr}, {"stop_reason", "stopped by SIGINT"}};
  EXPECT_EQ(SummaryLine(summary), "summary: not completed in 3.0 s, 0 steps; stop: stopped by SIGINT");
  EXPECT_EQ(SummaryLine(nlohmann::json::object()), "summary: ended");
}

}  // namespace
}  // namespace tessera
