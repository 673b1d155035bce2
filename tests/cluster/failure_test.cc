// A worker that dies (stops heartbeating without calling Done) never hangs the others: it leaves the clock gate
// and the sync rounds, and the others go on without it, in every mode.
#include <thread>

#include "gtest/gtest.h"
#include "tests/cluster/mini_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/param_printers.h"

namespace tessera::testing {
namespace {

using tessera::v1::ConsistencySpec;

// One step of a client: pull, push a constant gradient, clock.
absl::StatusOr<ClockResult> Step(PsClient& client) {
  std::vector<float> values(64), grad(64, 0.01f);
  if (absl::Status s = client.Pull({"w"}, {absl::MakeSpan(values)}); !s.ok()) return s;
  if (absl::Status s = client.Push({"w"}, {absl::MakeConstSpan(grad)}, 1); !s.ok()) return s;
  return client.Clock();
}

// A cluster (1 server, fast failure detection) with two heartbeating workers that declared "w".
struct TwoWorkers {
  absl::StatusOr<std::unique_ptr<MiniCluster>> cluster;
  absl::StatusOr<std::unique_ptr<PsClient>> survivor;
  absl::StatusOr<std::unique_ptr<PsClient>> doomed;

  void Start(ConsistencySpec::Mode mode, absl::Duration heartbeat_timeout = absl::Milliseconds(500)) {
    cluster = MiniCluster::Start(TestJob(mode, /*servers=*/1, /*workers=*/2), heartbeat_timeout);
    ASSERT_THAT(cluster, IsOk());
    survivor = (*cluster)->ConnectClient(/*heartbeat=*/true);
    doomed = (*cluster)->ConnectClient(/*heartbeat=*/true);
    ASSERT_THAT(survivor, IsOk());
    ASSERT_THAT(doomed, IsOk());
    ASSERT_THAT((*survivor)->Declare({FloatParam("w", 64)}), IsOk());
    ASSERT_THAT((*doomed)->Declare({FloatParam("w", 64)}), IsOk());
  }
};

class FailureTest : public ::testing::TestWithParam<ConsistencySpec::Mode> {};

TEST_P(FailureTest, LostWorkerLeavesTheClockGate) {
  TwoWorkers w;
  ASSERT_NO_FATAL_FAILURE(w.Start(GetParam()));
  auto& cluster = w.cluster;
  auto& survivor = w.survivor;
  auto& doomed = w.doomed;
  const int lost = (*doomed)->worker_id();
  // Step 0 together (each one's clock gate waits for the other).
  std::thread doomed_step([&] { EXPECT_THAT(Step(**doomed), IsOk()); });
  ASSERT_THAT(Step(**survivor), IsOk());
  doomed_step.join();
  doomed->reset();  // dies: no Done, no more heartbeats

  // Clock 2 needs the lost worker at clock >= 2 (SSP(0)) or a full round (SYNC): only its loss lets it through.
  for (int64_t steps = 1; steps < 5; ++steps) {
    absl::StatusOr<ClockResult> clock = Step(**survivor);
    ASSERT_THAT(clock, IsOk()) << "the survivor must not wait out its deadline";
    EXPECT_FALSE(clock->stop) << "the job goes on without the lost worker: " << clock->stop_reason;
  }
  ASSERT_THAT((*survivor)->Done(), IsOk());
  absl::StatusOr<nlohmann::json> summary = (*cluster)->WaitForSummary(absl::Seconds(30));
  ASSERT_THAT(summary, IsOk());
  EXPECT_EQ((*summary)["lost_workers"], nlohmann::json::array({lost}));
  EXPECT_TRUE((*summary)["completed"].get<bool>()) << summary->dump();
  EXPECT_EQ((*summary)["steps"], 5) << "the survivor's steps; the lost worker's clock does not count";
  ASSERT_FALSE((*summary)["events"].empty());
  EXPECT_EQ((*summary)["events"][0]["event"], "worker lost");
}

// A worker that dies after its clock went out but before its gradients did leaves a sync round open. The new
// view (without it) closes the round with the survivor's gradient alone, and the survivor's exchange answers.
TEST(FailureTest, SyncRoundClosesWithoutAWorkerLostInIt) {
  TwoWorkers w;
  ASSERT_NO_FATAL_FAILURE(w.Start(ConsistencySpec::SYNC));
  auto& cluster = w.cluster;
  auto& survivor = w.survivor;
  auto& doomed = w.doomed;
  const std::vector<std::string> names = {"w"};
  std::vector<float> grad(64, 0.01f), survivor_values(64), doomed_values(64), before(64);
  ASSERT_THAT((*survivor)->Pull(names, {absl::MakeSpan(before)}), IsOk());

  // The doomed worker starts a step (its clock goes out) and dies before sending anything.
  std::unique_ptr<StepExchange> last_words =
      (*doomed)->BeginStep(names, {absl::MakeConstSpan(grad)}, 1, {absl::MakeSpan(doomed_values)});
  std::unique_ptr<StepExchange> step =
      (*survivor)->BeginStep(names, {absl::MakeConstSpan(grad)}, 1, {absl::MakeSpan(survivor_values)});
  ASSERT_THAT(step->Send(0), IsOk());
  absl::StatusOr<ClockResult> clock = step->Finish();
  ASSERT_THAT(clock, IsOk());
  EXPECT_FALSE(clock->stop) << "both clocks went out, so the gate opened";
  last_words.reset();
  doomed->reset();  // no gradient, no Done, no more heartbeats

  const absl::Time start = absl::Now();
  ASSERT_THAT(step->WaitValues(0), IsOk());
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "the exchange's own deadline is minutes away";
  const float lr = TestJob(ConsistencySpec::SYNC, 1, 2).optimizer().learning_rate();
  for (int i = 0; i < 64; ++i) {
    EXPECT_NEAR(survivor_values[i], before[i] - lr * 0.01f, 1e-6) << "the round is the survivor's gradient alone";
  }
  step.reset();
  ASSERT_THAT(Step(**survivor), IsOk()) << "the next round needs the survivor only";
  ASSERT_THAT((*survivor)->Done(), IsOk());
  absl::StatusOr<nlohmann::json> summary = (*cluster)->WaitForSummary(absl::Seconds(30));
  ASSERT_THAT(summary, IsOk());
  EXPECT_TRUE((*summary)["completed"].get<bool>()) << summary->dump();
  EXPECT_EQ((*summary)["late_pushes"], 0);
}

// A worker that stops on an error says so: it leaves the gate at once (long before its heartbeat timeout), the
// others go on, and the records name the error.
TEST_P(FailureTest, AWorkerThatFailsLeavesAtOnceAndTheRecordsNameItsError) {
  TwoWorkers w;
  ASSERT_NO_FATAL_FAILURE(w.Start(GetParam(), /*heartbeat_timeout=*/absl::Minutes(2)));
  const int failed = (*w.doomed)->worker_id();
  std::thread doomed_step([&] { EXPECT_THAT(Step(**w.doomed), IsOk()); });
  ASSERT_THAT(Step(**w.survivor), IsOk());
  doomed_step.join();
  (*w.doomed)->Fail(absl::InternalError("CUDA error: an illegal memory access was encountered"));

  const absl::Time start = absl::Now();
  for (int steps = 1; steps < 5; ++steps) ASSERT_THAT(Step(**w.survivor), IsOk());
  EXPECT_LT(absl::Now() - start, absl::Seconds(60)) << "the gate waited for the heartbeat timeout (2 min)";
  ASSERT_THAT((*w.survivor)->Done(), IsOk());
  absl::StatusOr<nlohmann::json> summary = (*w.cluster)->WaitForSummary(absl::Seconds(30));
  ASSERT_THAT(summary, IsOk());
  EXPECT_TRUE((*summary)["completed"].get<bool>()) << summary->dump();
  EXPECT_EQ((*summary)["lost_workers"], nlohmann::json::array({failed}));
  ASSERT_FALSE((*summary)["events"].empty());
  EXPECT_EQ((*summary)["events"][0]["event"], "worker failed");
  EXPECT_EQ((*summary)["events"][0]["error"], "INTERNAL: CUDA error: an illegal memory access was encountered");
}

// When the last worker fails, the job waits one heartbeat timeout for it (a launcher or a pod may start it
// again), takes it back if it comes, and otherwise ends naming the error.
TEST(FailureTest, TheJobWaitsForAFailedLastWorkerThenEndsNamingItsError) {
  const absl::Duration timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<MiniCluster>> cluster =
      MiniCluster::Start(TestJob(ConsistencySpec::SYNC, /*servers=*/1, /*workers=*/1), timeout);
  ASSERT_THAT(cluster, IsOk());
  {
    absl::StatusOr<std::unique_ptr<PsClient>> first = (*cluster)->ConnectClient(/*heartbeat=*/true);
    ASSERT_THAT(first, IsOk());
    ASSERT_THAT((*first)->Declare({FloatParam("w", 64)}), IsOk());
    ASSERT_THAT(Step(**first), IsOk());
    (*first)->Fail(absl::UnavailableError("lost the GPU"));
  }
  EXPECT_FALSE((*cluster)->scheduler().coordinator().finished()) << "no time was left for a restart";
  absl::StatusOr<std::unique_ptr<PsClient>> again = (*cluster)->ConnectClient(/*heartbeat=*/true);
  ASSERT_THAT(again, IsOk()) << "a restarted worker takes the failed one's place";
  ASSERT_THAT((*again)->Declare({FloatParam("w", 64)}), IsOk());
  absl::SleepFor(timeout + absl::Milliseconds(500));
  EXPECT_FALSE((*cluster)->scheduler().coordinator().finished()) << "the job ended although its worker came back";
  ASSERT_THAT(Step(**again), IsOk());
  (*again)->Fail(absl::DataLossError("disk full"));

  absl::StatusOr<nlohmann::json> summary = (*cluster)->WaitForSummary(absl::Seconds(30));
  ASSERT_THAT(summary, IsOk());
  EXPECT_FALSE((*summary)["completed"].get<bool>());
  EXPECT_EQ((*summary)["stop_reason"], "every worker was lost (worker 0 at clock 2, which failed: DATA_LOSS: disk full)");
}

INSTANTIATE_TEST_SUITE_P(Modes, FailureTest, ::testing::Values(ConsistencySpec::SSP, ConsistencySpec::SYNC),
                         [](const auto& info) { return ConsistencySpec::Mode_Name(info.param); });

}  // namespace
}  // namespace tessera::testing
