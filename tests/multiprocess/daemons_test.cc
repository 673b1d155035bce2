// The real binaries as separate processes on loopback: tessera-launch, -scheduler, -server, -worker.
#include <dirent.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/job_spec.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/ports.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/daemon_test.h"
#include "tests/testing/subprocess.h"
#include "worker/param_file.h"

namespace tessera::testing {
namespace {

using DaemonsTest = DaemonTest;

constexpr char kSyncJob[] = R"(
name: "mp-sync"
model { mlp { hidden_sizes: [256, 128] } }
optimizer { kind: SGD learning_rate: 0.05 momentum: 0.9 }
batch_size: BATCH
consistency { mode: SYNC }
stop { max_steps: 20 }
eval_every_steps: 10
seed: 7
chunk_bytes: 65536
cluster { num_servers: 2 num_workers: WORKERS }
)";

std::string SyncJob(int batch, int workers) {
  std::string text = kSyncJob;
  text.replace(text.find("BATCH"), 5, std::to_string(batch));
  text.replace(text.find("WORKERS"), 7, std::to_string(workers));
  return text;
}

// Two worker processes in sync mode end with the parameters one local process gets on the union of their
// batches, and the run directory holds the records a user reads.
TEST_F(DaemonsTest, SyncClusterOfProcessesMatchesTheLocalBaseline) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)";
  const std::string run = (dir_ / "run").string();
  Subprocess launch({kBin + "/tessera-launch", "--linger_s=0", "--job=" + Write("sync.pbtxt", SyncJob(32, 2)), "--run_dir=" + run,
                     "--worker_devices=cpu,cpu", "--dump_params=" + (dir_ / "cluster.params").string(),
                     "--timeout_s=240"});
  ASSERT_TRUE(launch.ReadUntilExit(absl::Seconds(300))) << launch.output();
  ASSERT_EQ(launch.exit_code(), 0) << launch.output();

  ASSERT_NO_FATAL_FAILURE(RunLocal(SyncJob(64, 1), (dir_ / "local.params").string()));
  ExpectSameParameters((dir_ / "cluster.params").string(), (dir_ / "local.params").string(), 1e-5);

  std::ifstream summary_file(run + "/summary.json");
  nlohmann::json summary = nlohmann::json::parse(summary_file);
  for (const char* key : {"mode", "servers", "workers", "steps", "test_accuracy", "wall_seconds", "updates_applied",
                          "max_staleness"}) {
    EXPECT_TRUE(summary.contains(key)) << key;
  }
  EXPECT_EQ(summary["mode"], "sync");
  EXPECT_EQ(summary["updates_applied"], 20);
  EXPECT_EQ(summary["max_staleness"], 0);
  std::ifstream metrics(run + "/metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(metrics, line); ++records) {
    nlohmann::json record = nlohmann::json::parse(line);
    for (const char* key : {"step", "wall_seconds", "train_loss", "test_accuracy", "samples_per_sec", "max_staleness"}) {
      EXPECT_TRUE(record.contains(key)) << key << " in " << line;
    }
  }
  EXPECT_EQ(records, 2);
  EXPECT_NE(launch.output().find("step     10 |"), std::string::npos) << launch.output();
}

TEST_F(DaemonsTest, WorkerAndServerNameTheAddressWhereNoSchedulerAnswers) {
  const std::string address = absl::StrCat("127.0.0.1:", UnusedLoopbackPort());
  Subprocess worker({kBin + "/tessera-worker", "--scheduler=" + address, "--device=cpu", "--connect_timeout_s=2"});
  ASSERT_TRUE(worker.ReadUntilExit(absl::Seconds(60)));
  EXPECT_EQ(worker.exit_code(), 1);
  EXPECT_NE(worker.output().find("no scheduler answered at " + address), std::string::npos) << worker.output();
  Subprocess server({kBin + "/tessera-server", "--scheduler=" + address, "--connect_timeout_s=2"});
  ASSERT_TRUE(server.ReadUntilExit(absl::Seconds(60)));
  EXPECT_EQ(server.exit_code(), 1);
  EXPECT_NE(server.output().find(address), std::string::npos) << server.output();
}

// A server started again after its job ended finds no scheduler: with its default --connect_timeout_s it gives up
// within half a minute (not two), saying why there may be none.
TEST_F(DaemonsTest, AServerWhoseSchedulerIsGoneGivesUpWithinItsDefaultConnectTimeout) {
  const std::string address = absl::StrCat("127.0.0.1:", UnusedLoopbackPort());
  const absl::Time start = absl::Now();
  Subprocess server({kBin + "/tessera-server", "--scheduler=" + address, "--http_port=-1"});
  ASSERT_TRUE(server.ReadUntilExit(absl::Seconds(90)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(40)) << server.output();
  EXPECT_EQ(server.exit_code(), 1);
  EXPECT_NE(server.output().find("its job ended and it exited"), std::string::npos) << server.output();
}

TEST_F(DaemonsTest, SchedulerNamesTheLineOfAMalformedJobAndTheFieldOfAContradictoryOne) {
  Subprocess bad({kBin + "/tessera-scheduler", "--job=" + Write("bad.pbtxt", "name: \"x\"\nmodel {\n  mlp { hidden_sizes: [4, }\n}\n")});
  ASSERT_TRUE(bad.ReadUntilExit(absl::Seconds(30)));
  EXPECT_EQ(bad.exit_code(), 2);
  EXPECT_NE(bad.output().find("line 3"), std::string::npos) << bad.output();
  Subprocess contradictory({kBin + "/tessera-scheduler",
                            "--job=" + Write("c.pbtxt", "model { softmax_regression {} } stop { max_steps: 1 }\n"
                                                        "consistency { mode: ASYNC staleness: 2 }\n")});
  ASSERT_TRUE(contradictory.ReadUntilExit(absl::Seconds(30)));
  EXPECT_EQ(contradictory.exit_code(), 2);
  EXPECT_NE(contradictory.output().find("consistency.staleness"), std::string::npos) << contradictory.output();
}

// Workers that fail are reported with the end of their logs; the scheduler ends the job once none is left, and
// the launcher exits non-zero with the scheduler's reason, leaving no daemon behind.
TEST_F(DaemonsTest, LauncherStopsTheClusterWhenAChildFails) {
  const std::string job = Write("missing.pbtxt", absl::StrCat(R"(
model { softmax_regression {} }
data { format: IDX train_images: ")", kFashionMnistDir, R"(/missing-train-images.gz" }
stop { max_steps: 5 }
cluster { num_servers: 1 num_workers: 2 }
)"));
  Subprocess launch({kBin + "/tessera-launch", "--linger_s=0", "--job=" + job, "--run_dir=" + (dir_ / "run").string(), "--device=cpu"});
  ASSERT_TRUE(launch.ReadUntilExit(absl::Seconds(120))) << launch.output();
  EXPECT_EQ(launch.exit_code(), 1);
  EXPECT_NE(launch.output().find("worker 0 failed"), std::string::npos) << launch.output();
  EXPECT_NE(launch.output().find("dataset-fashion-mnist"), std::string::npos) << launch.output();
  // The scheduler, not the launcher, ends the job: every worker told it the error it stopped on, and no
  // worker came back within the heartbeat timeout.
  EXPECT_NE(launch.output().find("every worker was lost (worker 0 at clock 0, which failed: NOT_FOUND: data file "),
            std::string::npos)
      << launch.output();
  const std::string address = SchedulerAddress(launch.output());
  ASSERT_FALSE(address.empty()) << launch.output();
  EXPECT_TRUE(ProcessesMentioning(address).empty()) << "daemons outlived the launcher";
}

// Ctrl-C (SIGINT) on a running cluster: the job stops gracefully, the summary names the interrupt, every daemon
// stops and the launcher exits 130.
TEST_F(DaemonsTest, InterruptStopsEveryDaemon) {
  const std::string job = Write("long.pbtxt", R"(
model { mlp { hidden_sizes: 16 } }
data { format: SYNTHETIC }
consistency { mode: SSP staleness: 1 }
stop { max_steps: 100000000 }
eval_every_steps: 50
cluster { num_servers: 2 num_workers: 2 }
)");
  Subprocess launch({kBin + "/tessera-launch", "--linger_s=0", "--job=" + job, "--run_dir=" + (dir_ / "run").string(), "--device=cpu"});
  ASSERT_TRUE(launch.ReadUntilLine("step     50 |", absl::Seconds(120))) << launch.output();
  const std::string address = SchedulerAddress(launch.output());
  ASSERT_FALSE(address.empty());
  ASSERT_EQ(ProcessesMentioning(address).size(), 4u) << "2 servers and 2 workers should be running";
  kill(launch.pid(), SIGINT);
  ASSERT_TRUE(launch.ReadUntilExit(absl::Seconds(60))) << launch.output();
  EXPECT_EQ(launch.exit_code(), 130) << launch.output();
  EXPECT_TRUE(ProcessesMentioning(address).empty()) << "daemons outlived the launcher";
  const nlohmann::json summary = ReadJson(dir_ / "run" / "summary.json");
  EXPECT_EQ(summary["stop_reason"], "stopped by SIGINT") << launch.output();
  EXPECT_EQ(summary["completed"], false);
}

// The three-terminal recipe of worker/README.md, with the example program as the worker: a training loop written against
// the client library learns its weights through real daemons.
TEST_F(DaemonsTest, ExampleClientProgramTrainsAgainstHandStartedDaemons) {
  Subprocess scheduler({kBin + "/tessera-scheduler", "--job=" + std::string(TESSERA_SOURCE_DIR) + "/deploy/jobs/custom_loop.pbtxt",
                        "--port=0", "--run_dir=" + (dir_ / "run").string()});
  ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
  const std::string address = SchedulerAddress(scheduler.output());
  ASSERT_FALSE(address.empty()) << scheduler.output();
  Subprocess server({kBin + "/tessera-server", "--scheduler=" + address});
  Subprocess example({kBin + "/tessera-example-linear-regression", "--scheduler=" + address});
  ASSERT_TRUE(example.ReadUntilExit(absl::Seconds(120))) << example.output();
  EXPECT_EQ(example.exit_code(), 0) << example.output();
  const size_t at = example.output().find("final loss ");
  ASSERT_NE(at, std::string::npos) << example.output();
  EXPECT_LT(std::stod(example.output().substr(at + 11)), 0.05) << example.output();
  // The job is over: the scheduler shuts the server down and exits.
  ASSERT_TRUE(server.ReadUntilExit(absl::Seconds(60))) << server.output();
  EXPECT_EQ(server.exit_code(), 0) << server.output();
  ASSERT_TRUE(scheduler.ReadUntilExit(absl::Seconds(60))) << scheduler.output();
  EXPECT_EQ(scheduler.exit_code(), 0) << scheduler.output();
}

// A second daemon on a port already in use fails at start and names the port, instead of sharing it (gRPC sets
// SO_REUSEPORT unless told not to, which would split the cluster between two schedulers).
TEST_F(DaemonsTest, ADaemonOnAPortInUseFailsAndNamesThePort) {
  const std::string job = std::string(TESSERA_SOURCE_DIR) + "/deploy/jobs/custom_loop.pbtxt";
  Subprocess first({kBin + "/tessera-scheduler", "--job=" + job, "--port=0", "--run_dir=" + (dir_ / "a").string()});
  ASSERT_TRUE(first.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << first.output();
  const std::string address = SchedulerAddress(first.output());
  ASSERT_FALSE(address.empty()) << first.output();
  const std::string port = address.substr(address.rfind(':') + 1);
  Subprocess second({kBin + "/tessera-scheduler", "--job=" + job, "--port=" + port,
                     "--run_dir=" + (dir_ / "b").string()});
  ASSERT_TRUE(second.ReadUntilExit(absl::Seconds(30))) << second.output();
  EXPECT_NE(second.exit_code(), 0) << second.output();
  EXPECT_NE(second.output().find("port " + port + " is in use"), std::string::npos) << second.output();
  Subprocess server({kBin + "/tessera-server", "--scheduler=" + address, "--port=" + port});
  ASSERT_TRUE(server.ReadUntilExit(absl::Seconds(30))) << server.output();
  EXPECT_NE(server.exit_code(), 0) << server.output();
  EXPECT_NE(server.output().find("port " + port + " is in use"), std::string::npos) << server.output();
}

}  // namespace
}  // namespace tessera::testing
