#include "common/daemon/run_recorder.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

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

// A run's events go to events.jsonl as they happen, for a restarted scheduler to read back; a run that never wrote
// its summary is unfinished; starting afresh there moves every earlier record aside and nothing is lost.
TEST(RunRecorderTest, EventsAreReadBackAndAnUnfinishedRunMovesAsideWhenAJobStartsAfresh) {
  const std::string dir = ::testing::TempDir() + "/run-recorder-events";
  std::filesystem::remove_all(dir);
  {
    absl::StatusOr<std::unique_ptr<RunRecorder>> first = RunRecorder::Create(dir);
    ASSERT_TRUE(first.ok()) << first.status();
    (*first)->AppendEvent({{"event", "worker lost"}, {"worker", 1}});
    (*first)->AppendEvent({{"event", "server drained"}, {"server", 0}});
  }
  EXPECT_TRUE(UnfinishedRun(dir));
  const std::vector<nlohmann::json> events = RunRecorder::ReadEvents(dir);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["event"], "worker lost");
  EXPECT_EQ(events[1]["server"], 0);

  absl::StatusOr<std::unique_ptr<RunRecorder>> again = RunRecorder::Create(dir, /*append=*/true);
  ASSERT_TRUE(again.ok()) << again.status();
  (*again)->AppendEvent({{"event", "scheduler restarted, job taken back"}});
  EXPECT_EQ(RunRecorder::ReadEvents(dir).size(), 3u) << "a restarted scheduler adds to the run's events";
  ASSERT_TRUE((*again)->StartAfresh().ok());
  EXPECT_TRUE(RunRecorder::ReadEvents(dir).empty()) << "a job started afresh begins its own records";
  int moved = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("replaced-", 0) == 0) {
      ++moved;
      EXPECT_EQ(RunRecorder::ReadEvents(entry.path().string()).size(), 3u);
      EXPECT_TRUE(std::filesystem::exists(entry.path() / "metrics.jsonl"));
    }
  }
  EXPECT_EQ(moved, 1);
  EXPECT_FALSE(UnfinishedRun(::testing::TempDir() + "/no-such-run"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
