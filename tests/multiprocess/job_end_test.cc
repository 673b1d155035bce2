// The end of a job that succeeds: many short jobs, to a target accuracy and to a few steps, in SYNC, ASYNC and
// SSP, over gRPC and UCX, with 1 and 2 servers and workers. Each must end completed: no server leaves while a
// worker still needs it for the job's last values, a worker that finds the job over reports no server lost, and
// a scheduler that decided the job complete never makes that a failure.
//
// Each variant runs JOB_END_TEST_RUNS jobs (default 1, to the target; runs alternate: the target, 40 steps);
// for a loop, e.g.
//   JOB_END_TEST_RUNS=20 build/bin/job_end_test
// The counts per variant go to the test's output ("completed N of M"). JOB_END_TEST_BIN_DIR runs the binaries of
// another folder (a copy of build/bin, for a long loop while the build folder changes).
#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/daemon_test.h"
#include "tests/testing/subprocess.h"

namespace tessera::testing {
namespace {

// A small synthetic job on `servers` servers and `workers` workers. `to_target`: it stops when rank 0's
// evaluation reaches a test accuracy most runs reach within a few hundred steps (every 5 steps evaluated, so
// the stop comes mid-step for the others); otherwise after 40 steps. Its first layer's chunks (32 KiB) are
// large enough that UCX moves them by rendezvous, whose end a job's stop must not break.
std::string Job(const std::string& mode, const std::string& transport, int servers, int workers, bool to_target) {
  return absl::StrCat(transport == "UCX" ? "transport: UCX trusted_network: true\n" : "", R"(
name: "job-end"
model { mlp { hidden_sizes: 256 } }
data { format: SYNTHETIC synthetic_train_examples: 2048 synthetic_features: 64 synthetic_classes: 4 }
optimizer { kind: SGD learning_rate: 0.1 }
batch_size: 16
consistency { mode: )", mode, mode == "SSP" ? " staleness: 2" : "", R"( }
eval_every_steps: 5
chunk_bytes: 32768
cluster { num_servers: )", servers, " num_workers: ", workers, " }\n",
                      to_target ? "stop { target_accuracy: 0.55 max_steps: 2000 }\n" : "stop { max_steps: 40 }\n");
}

std::string BinDir() {
  const char* dir = std::getenv("JOB_END_TEST_BIN_DIR");
  return dir != nullptr && *dir != '\0' ? dir : kBin;
}

int Runs() {
  int runs = 1;
  const char* text = std::getenv("JOB_END_TEST_RUNS");
  if (text != nullptr && (!absl::SimpleAtoi(text, &runs) || runs < 1)) runs = 1;
  return runs;
}

// (mode, transport, servers and workers)
class JobEndTest : public DaemonTest,
                   public ::testing::WithParamInterface<std::tuple<std::string, std::string, int>> {};

// Every run ends completed (launcher exit 0, summary completed, no worker lost, no server lost).
TEST_P(JobEndTest, EveryShortJobEndsCompleted) {
  const auto [mode, transport, size] = GetParam();
  const int runs = Runs();
  int completed = 0;
  int late = 0;  // runs that completed though a worker's last call failed after the stop (the events say so)
  for (int run = 0; run < runs; ++run) {
    const bool to_target = run % 2 == 0;
    SCOPED_TRACE(absl::StrCat("run ", run, to_target ? " (to the target)" : " (40 steps)"));
    const std::string job = Write(absl::StrCat("job-", run, ".pbtxt"), Job(mode, transport, size, size, to_target));
    const std::filesystem::path run_dir = dir_ / absl::StrCat("run-", run);
    Subprocess launch({BinDir() + "/tessera-launch", "--linger_s=0", "--job=" + job, "--run_dir=" + run_dir.string(),
                       "--device=cpu"});
    ASSERT_TRUE(launch.ReadUntilExit(absl::Seconds(120))) << launch.output();
    const nlohmann::json summary = ReadJson(run_dir / "summary.json");
    bool ok = launch.exit_code() == 0 && !summary.is_discarded() && summary.value("completed", false) &&
              summary.value("lost_workers", nlohmann::json::array()).empty();
    bool failed_late = false;
    for (const nlohmann::json& e : summary.value("events", nlohmann::json::array())) {
      const std::string event = e.value("event", "");
      // A server that dies at the end is a failure here even though the job's verdict stands.
      ok = ok && event != "server lost" && event != "loss after the job completed";
      failed_late |= event == "worker stopped with the job";
    }
    ok = ok && launch.output().find("failed (signal") == std::string::npos;
    late += ok && failed_late;
    EXPECT_TRUE(ok) << "exit code " << launch.exit_code() << "\n" << launch.output() << "\n"
                    << (summary.is_discarded() ? "no summary" : summary.dump(2));
    if (ok) {
      ++completed;
    } else {
      std::filesystem::rename(run_dir, dir_ / absl::StrCat("failed-", run));  // kept for a look (TearDown)
    }
  }
  std::cout << "job end, " << mode << " over " << transport << ", " << size << " server(s) + " << size
            << " worker(s): completed " << completed << " of " << runs << " (" << late
            << " with a worker's last call failed after the stop)" << std::endl;
  EXPECT_EQ(completed, runs);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, JobEndTest,
    ::testing::Combine(::testing::Values(std::string("SYNC"), std::string("ASYNC"), std::string("SSP")),
                       ::testing::Values(std::string("GRPC"), std::string("UCX")),
                       ::testing::Values(1, 2)),
    [](const auto& info) {
      return absl::StrCat(std::get<0>(info.param), "_", std::get<1>(info.param), "_", std::get<2>(info.param), "x",
                          std::get<2>(info.param));
    });

}  // namespace
}  // namespace tessera::testing
