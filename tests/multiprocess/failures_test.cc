// Failures of real processes, killed by signal: a worker that dies and comes back, a server dead before the job
// starts, a server lost during a job, the scheduler lost; checkpoints that fail, stops that must be carried out.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/daemon_test.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/subprocess.h"
#include "worker/param_file.h"

namespace tessera::testing {
namespace {

class FailuresTest : public DaemonTest {
 protected:
  // Runs `job` to its end with nothing killed; its final parameters go to dir_/full.params.
  void RunUndisturbed(const std::string& job) {
    Subprocess full({kBin + "/tessera-launch", "--linger_s=0", "--job=" + job, "--run_dir=" + (dir_ / "full").string(),
                     "--device=cpu", "--dump_params=" + (dir_ / "full.params").string()});
    ASSERT_TRUE(full.ReadUntilExit(absl::Seconds(120))) << full.output();
    ASSERT_EQ(full.exit_code(), 0) << full.output();
  }

  // The parameters in `dump` are those of the undisturbed run (relative error under 1e-6).
  void ExpectTheUndisturbedParameters(const std::string& dump) {
    ExpectSameParameters((dir_ / "full.params").string(), dump, 1e-6);
  }
};

// A small synthetic job that runs for a few seconds on two cores; `transport` "UCX" moves its chunks over UCX.
std::string Job(const std::string& mode, int servers, int workers, int steps, float momentum = 0,
                const std::string& transport = "GRPC") {
  return absl::StrCat(transport == "UCX" ? "transport: UCX trusted_network: true\n" : "", R"(
name: "failures"
model { mlp { hidden_sizes: 32 } }
data { format: SYNTHETIC synthetic_train_examples: 4096 synthetic_features: 64 synthetic_classes: 8 }
optimizer { kind: SGD learning_rate: 0.05 momentum: )", momentum, R"( }
batch_size: 16
consistency { mode: )", mode, R"( }
stop { max_steps: )", steps, R"( }
eval_every_steps: 100
chunk_bytes: 4096
cluster { num_servers: )", servers, " num_workers: ", workers, " }\n");
}

// The processes whose command line has both `a` and `b`, oldest first.
std::vector<int> ProcessesMentioningBoth(const std::string& a, const std::string& b) {
  std::vector<int> both;
  for (int pid : ProcessesMentioning(a)) {
    for (int other : ProcessesMentioning(b)) {
      if (pid == other) both.push_back(pid);
    }
  }
  std::sort(both.begin(), both.end());
  return both;
}

// The one process whose command line has both `a` and `b` (-1 unless exactly one does), or the `index`-th of
// them.
int OnlyProcess(const std::string& a, const std::string& b, int index = -1) {
  std::vector<int> both = ProcessesMentioningBoth(a, b);
  if (index >= 0) return index < static_cast<int>(both.size()) ? both[index] : -1;
  return both.size() == 1 ? both[0] : -1;
}

// A fast failure detector for daemons started by hand.
const std::vector<std::string> kFastHeartbeats = {"--heartbeat_interval_ms=100", "--heartbeat_timeout_ms=1500"};

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// (consistency mode, transport)
class WorkerRestartTest : public FailuresTest,
                          public ::testing::WithParamInterface<std::tuple<std::string, std::string>> {
 protected:
  std::string mode() const { return std::get<0>(GetParam()); }
  std::string transport() const { return std::get<1>(GetParam()); }
};

// kill -9 of a worker mid-run: the launcher starts it again with its rank, it rejoins the running job with a new
// incarnation at the clock the others are at, and the job completes. In SYNC every round is applied exactly once.
TEST_P(WorkerRestartTest, AKilledWorkerRejoinsTheRunningJob) {
  // In ASYNC nothing holds the victim back: over UCX its steps are fast enough that it could finish before rank 0
  // reports step 300, so there it takes 2 ms longer a step and is surely mid-run when killed.
  const int steps = 4000;
  const std::string job = Write("job.pbtxt", Job(mode(), 2, 2, steps, 0, transport()));
  const std::filesystem::path run = dir_ / "run";
  std::vector<std::string> argv = {kBin + "/tessera-launch", "--linger_s=0", "--job=" + job, "--run_dir=" + run.string(),
                                   "--device=cpu", "--restart_workers=1"};
  if (transport() == "UCX") argv.insert(argv.end(), {"--slow_worker=1", "--inject_slowdown_ms=2"});
  Subprocess launch(argv);
  ASSERT_TRUE(launch.ReadUntilLine("step    300 |", absl::Seconds(120))) << launch.output();
  // In ASYNC rank 0 trains without waiting for rank 1, which may not have registered yet on a loaded machine:
  // killed before it did, its restart would be its first join, not a return.
  const absl::Time registered_by = absl::Now() + absl::Seconds(60);
  while (absl::Now() < registered_by) {
    std::ifstream log(run / "logs/scheduler.log");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    if (text.find("worker 1 on ") != std::string::npos && text.find("registered", text.find("worker 1 on ")) != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string address = SchedulerAddress(launch.output());
  const int victim = OnlyProcess(address, "--rank=1");
  ASSERT_GT(victim, 0) << launch.output();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  ASSERT_TRUE(launch.ReadUntilExit(absl::Seconds(180))) << launch.output();
  EXPECT_EQ(launch.exit_code(), 0) << launch.output();
  EXPECT_NE(launch.output().find("restarted worker 1 (1 of 1 restarts)"), std::string::npos) << launch.output();

  const nlohmann::json summary = ReadJson(run / "summary.json");
  ASSERT_TRUE(summary.is_object()) << launch.output();
  EXPECT_TRUE(summary["completed"].get<bool>()) << summary.dump();
  bool rejoined = false;
  for (const auto& e : summary["events"]) {
    if (e["event"] == "worker rejoined" && e["worker"] == 1 && e["incarnation"] == 2) rejoined = true;
  }
  EXPECT_TRUE(rejoined) << summary.dump();
  EXPECT_EQ(summary["steps"], steps) << summary.dump();
  if (mode() == "SYNC") {
    EXPECT_EQ(summary["updates_applied"], steps) << "one update per round, none lost or doubled: " << summary.dump();
  }
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.5) << summary.dump();
  EXPECT_TRUE(ProcessesMentioning(address).empty()) << "daemons outlived the launcher";
}

INSTANTIATE_TEST_SUITE_P(Modes, WorkerRestartTest,
                         ::testing::Values(std::make_tuple(std::string("SYNC"), std::string("GRPC")),
                                           std::make_tuple(std::string("ASYNC"), std::string("GRPC")),
                                           std::make_tuple(std::string("SSP staleness: 2"), std::string("GRPC")),
                                           std::make_tuple(std::string("ASYNC"), std::string("UCX"))),
                         [](const auto& info) {
                           const std::string mode = std::get<0>(info.param);
                           const std::string transport = std::get<1>(info.param);
                           return (mode.substr(0, 4) == "SSP " ? std::string("SSP") : mode) +
                                  (transport == "GRPC" ? "" : "_over_" + transport);
                         });

// A server that dies before the job starts: the scheduler says whom it waits for and who was lost, and a
// replacement takes the lost server's place and the job completes.
TEST_F(FailuresTest, AReplacementCompletesAJobWhoseServerDiedBeforeItStarted) {
  const std::string job = Write("job.pbtxt", Job("SYNC", 2, 1, 200));
  Subprocess scheduler(Concat({kBin + "/tessera-scheduler", "--job=" + job, "--run_dir=" + (dir_ / "run").string()},
                              kFastHeartbeats));
  ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
  const std::string address = SchedulerAddress(scheduler.output());
  Subprocess first({kBin + "/tessera-server", "--scheduler=" + address});
  {
    Subprocess doomed({kBin + "/tessera-server", "--scheduler=" + address});
    ASSERT_TRUE(scheduler.ReadUntilLine("server 1 at ", absl::Seconds(30))) << scheduler.output();
    kill(doomed.pid(), SIGKILL);
  }
  ASSERT_TRUE(scheduler.ReadUntilLine("waiting for 1 more server and 1 more worker; server 0 at", absl::Seconds(30)))
      << scheduler.output();
  const size_t waiting = scheduler.output().find("waiting for 1 more server and 1 more worker");
  EXPECT_NE(scheduler.output().find("server 1 at 127.0.0.1:", waiting), std::string::npos) << scheduler.output();
  EXPECT_NE(scheduler.output().find(" lost, last heard ", waiting), std::string::npos) << scheduler.output();

  Subprocess replacement({kBin + "/tessera-server", "--scheduler=" + address});
  Subprocess worker({kBin + "/tessera-worker", "--scheduler=" + address, "--device=cpu"});
  ASSERT_TRUE(scheduler.ReadUntilExit(absl::Seconds(120))) << scheduler.output();
  EXPECT_EQ(scheduler.exit_code(), 0) << scheduler.output();
  EXPECT_NE(scheduler.output().find("(incarnation 2)"), std::string::npos) << "the replacement is server 1, again";
  ASSERT_TRUE(worker.ReadUntilExit(absl::Seconds(60))) << worker.output();
  EXPECT_EQ(worker.exit_code(), 0) << worker.output();
}

// A server killed just before the workers declare, while the scheduler still counts it alive: the hand-over of
// the placement fails, so nothing is placed; the worker's retries wait, the replacement (started as an operator
// would, with the lost server's --id) takes its place, and the job completes on a placement both servers hold.
TEST_F(FailuresTest, APlacementTheServersNeverReceivedIsNeverRecorded) {
  const std::string job = Write("job.pbtxt", Job("SYNC", 2, 1, 200));
  Subprocess scheduler({kBin + "/tessera-scheduler", "--job=" + job, "--run_dir=" + (dir_ / "run").string(),
                        "--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=20000"});
  ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
  const std::string address = SchedulerAddress(scheduler.output());
  Subprocess first({kBin + "/tessera-server", "--scheduler=" + address, "--id=0"});
  {
    Subprocess doomed({kBin + "/tessera-server", "--scheduler=" + address, "--id=1"});
    ASSERT_TRUE(scheduler.ReadUntilLine("server 1 at ", absl::Seconds(30))) << scheduler.output();
    ASSERT_TRUE(scheduler.ReadUntilLine("server 0 at ", absl::Seconds(30))) << scheduler.output();
    kill(doomed.pid(), SIGKILL);
  }
  Subprocess worker({kBin + "/tessera-worker", "--scheduler=" + address, "--device=cpu"});
  ASSERT_TRUE(scheduler.ReadUntilLine("not placed", absl::Seconds(30))) << scheduler.output();
  Subprocess replacement({kBin + "/tessera-server", "--scheduler=" + address, "--id=1"});
  ASSERT_TRUE(scheduler.ReadUntilExit(absl::Seconds(120))) << scheduler.output();
  EXPECT_EQ(scheduler.exit_code(), 0) << scheduler.output();
  ASSERT_TRUE(worker.ReadUntilExit(absl::Seconds(60))) << worker.output();
  EXPECT_EQ(worker.exit_code(), 0) << worker.output();
}

// A server and then a worker killed with SIGKILL and started again a second later with the same command (no
// --rank, no --id, as an operator or a process supervisor does), before their old selves are declared lost: each
// waits for its old slot instead of giving up, takes it with a new incarnation, and the job completes.
TEST_F(FailuresTest, AMemberRestartedWithoutItsRankOrIdTakesBackItsPlace) {
  const std::string job = Write("job.pbtxt", Job("SYNC", 2, 2, 2500) + absl::StrCat(
      "checkpoint { dir: \"", (dir_ / "checkpoints").string(), "\" every_steps: 100 }\n"));
  const std::filesystem::path run = dir_ / "run";
  Subprocess scheduler({kBin + "/tessera-scheduler", "--job=" + job, "--run_dir=" + run.string(),
                        "--heartbeat_interval_ms=200", "--heartbeat_timeout_ms=4000"});
  ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
  const std::string address = SchedulerAddress(scheduler.output());
  const std::vector<std::string> server_argv = {kBin + "/tessera-server", "--scheduler=" + address};
  const std::vector<std::string> worker_argv = {kBin + "/tessera-worker", "--scheduler=" + address, "--device=cpu"};
  Subprocess server0(server_argv);
  auto server1 = std::make_unique<Subprocess>(server_argv);
  Subprocess worker0(worker_argv);
  auto worker1 = std::make_unique<Subprocess>(worker_argv);
  ASSERT_TRUE(scheduler.ReadUntilLine("step    300 |", absl::Seconds(120))) << scheduler.output();

  for (auto* victim : {&server1, &worker1}) {
    kill((*victim)->pid(), SIGKILL);
    victim->reset();
    absl::SleepFor(absl::Seconds(1));
    *victim = std::make_unique<Subprocess>(victim == &worker1 ? worker_argv : server_argv);
    // "worker N on HOST registered (incarnation 2) on cpu, ...", "server N at ADDRESS registered (incarnation 2)"
    const std::string back = victim == &worker1 ? "registered (incarnation 2) on cpu" : "registered (incarnation 2)\n";
    ASSERT_TRUE(scheduler.ReadUntil(back, absl::Seconds(30)))
        << "the restarted member never took its place:\n" << scheduler.output() << (*victim)->output();
    EXPECT_EQ((*victim)->output().find("no place for"), std::string::npos) << (*victim)->output();
  }
  ASSERT_TRUE(scheduler.ReadUntilExit(absl::Seconds(240))) << scheduler.output();
  EXPECT_EQ(scheduler.exit_code(), 0) << scheduler.output();
  const nlohmann::json summary = ReadJson(run / "summary.json");
  ASSERT_TRUE(summary.is_object()) << scheduler.output();
  EXPECT_TRUE(summary["completed"].get<bool>()) << summary.dump();
  for (Subprocess* member : {&worker0, worker1.get()}) {
    ASSERT_TRUE(member->ReadUntilExit(absl::Seconds(60))) << member->output();
    EXPECT_EQ(member->exit_code(), 0) << member->output();
  }
}

// A server frozen (SIGSTOP) in a job without a checkpoint: the stop decided at the heartbeat timeout is carried
// out within seconds: the scheduler ends the job naming the server and every worker exits, in every mode (not
// after the workers' own minute of retries against a server that cannot come back). In ASYNC the second worker
// registers only after the freeze: its registration waits on the frozen server (the servers take its key first),
// and that wait is not its silence: it is not lost either.
TEST_F(FailuresTest, AStopDecidedIsCarriedOutWithinSeconds) {
  for (const std::string mode : {"SYNC", "ASYNC"}) {
    SCOPED_TRACE(mode);
    const bool late_worker = mode == "ASYNC";
    const std::string job = Write("job.pbtxt", Job(mode, 2, 2, 100000000));
    Subprocess scheduler(Concat({kBin + "/tessera-scheduler", "--job=" + job, "--run_dir=" + (dir_ / mode).string()},
                                kFastHeartbeats));
    ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
    const std::string address = SchedulerAddress(scheduler.output());
    const std::vector<std::string> worker_argv = {kBin + "/tessera-worker", "--scheduler=" + address, "--device=cpu"};
    Subprocess server0({kBin + "/tessera-server", "--scheduler=" + address});
    Subprocess server1({kBin + "/tessera-server", "--scheduler=" + address});
    Subprocess worker0(worker_argv);
    std::unique_ptr<Subprocess> worker1;
    if (!late_worker) worker1 = std::make_unique<Subprocess>(worker_argv);
    ASSERT_TRUE(scheduler.ReadUntilLine("step    200 |", absl::Seconds(120))) << scheduler.output();
    ASSERT_EQ(kill(server1.pid(), SIGSTOP), 0);
    const absl::Time frozen = absl::Now();
    if (late_worker) {
      worker1 = std::make_unique<Subprocess>(worker_argv);
      ASSERT_TRUE(scheduler.ReadUntil("worker 1 on ", absl::Seconds(10))) << scheduler.output() << worker1->output();
    }
    ASSERT_TRUE(scheduler.ReadUntilExit(absl::Seconds(60))) << scheduler.output();
    const absl::Duration ended = absl::Now() - frozen;
    // Detection (1.5 s) + the workers' chance to report (1.5 s) + shutting down, with room for a slow machine.
    EXPECT_LT(ended, absl::Seconds(12)) << scheduler.output();
    EXPECT_EQ(scheduler.exit_code(), 3) << scheduler.output();
    EXPECT_NE(scheduler.output().find("cannot be restored without a checkpoint"), std::string::npos)
        << scheduler.output();
    for (Subprocess* worker : {&worker0, worker1.get()}) {
      ASSERT_TRUE(worker->ReadUntilExit(absl::Seconds(15))) << worker->output();
    }
    EXPECT_LT(absl::Now() - frozen, absl::Seconds(20)) << worker0.output() << worker1->output();
    // The workers stopped because the job did: they are not lost.
    const nlohmann::json summary = ReadJson(dir_ / mode / "summary.json");
    EXPECT_EQ(summary.value("lost_workers", nlohmann::json()), nlohmann::json::array())
        << summary.dump(2) << scheduler.output() << worker0.output() << worker1->output();
    kill(server1.pid(), SIGCONT);
  }
}

// Checkpoints that cannot be written (here: a server whose files may not grow past a few KiB, as on a full disk)
// are reported, not hidden: POST /checkpoint answers an error status naming the cause, /metrics counts the
// failures, the summary says so; nothing of a failed checkpoint stays on disk, the cadence retries with a
// growing backoff, and training goes on.
TEST_F(FailuresTest, CheckpointsThatFailAreReportedCleanedUpAndRetriedWithBackoff) {
  const std::filesystem::path checkpoints = dir_ / "checkpoints";
  const std::string job = Write("job.pbtxt", Job("SYNC", 1, 1, 100000000) + absl::StrCat(
      "checkpoint { dir: \"", checkpoints.string(), "\" every_steps: 20 }\n"));
  const std::filesystem::path run = dir_ / "run";
  Subprocess scheduler({kBin + "/tessera-scheduler", "--job=" + job, "--run_dir=" + run.string()});
  ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
  const std::string address = SchedulerAddress(scheduler.output());
  const std::string marker = "dashboard at http://127.0.0.1:";
  ASSERT_TRUE(scheduler.ReadUntilLine(marker, absl::Seconds(30))) << scheduler.output();
  const int http_port = std::atoi(scheduler.output().c_str() + scheduler.output().find(marker) + marker.size());
  // Files of at most 8 blocks; SIGXFSZ ignored, so a write past it fails with EFBIG instead of killing.
  Subprocess server({"/bin/sh", "-c", "trap '' XFSZ; ulimit -f 8; exec \"$0\" \"$@\"", kBin + "/tessera-server",
                     "--scheduler=" + address});
  Subprocess worker({kBin + "/tessera-worker", "--scheduler=" + address, "--device=cpu"});
  ASSERT_TRUE(scheduler.ReadUntilLine("step    100 |", absl::Seconds(120))) << scheduler.output();
  const absl::Time first_failure = absl::Now();
  absl::SleepFor(absl::Seconds(6));

  httplib::Client client("127.0.0.1", http_port);
  httplib::Result asked = client.Post("/checkpoint");
  ASSERT_TRUE(asked) << httplib::to_string(asked.error());
  EXPECT_GE(asked->status, 400) << asked->body;
  EXPECT_NE(asked->body.find("server 0"), std::string::npos) << asked->body;
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  const std::string counter = "\ntessera_scheduler_checkpoint_failures_total ";
  const size_t at = metrics->body.find(counter);
  ASSERT_NE(at, std::string::npos) << metrics->body;
  const int64_t failures = std::atoll(metrics->body.c_str() + at + counter.size());
  EXPECT_GE(failures, 2) << metrics->body;
  // Without a backoff the cadence tried every 0.2 s (about 30 times in 6 s); with it: 1 + 2 + 4 s apart.
  EXPECT_LE(failures, 6) << "failed checkpoints were retried without a backoff over "
                         << absl::FormatDuration(absl::Now() - first_failure);
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints)) {
    left.push_back(entry.path().filename().string());
  }
  EXPECT_TRUE(left.empty()) << "failed checkpoints left " << left.size() << " entries, e.g. " << left.front();

  kill(scheduler.pid(), SIGTERM);
  ASSERT_TRUE(scheduler.ReadUntilExit(absl::Seconds(60))) << scheduler.output();
  const nlohmann::json summary = ReadJson(run / "summary.json");
  ASSERT_TRUE(summary.is_object()) << scheduler.output();
  EXPECT_GE(summary["checkpoints"]["failed"].get<int64_t>(), failures) << summary.dump();
  EXPECT_EQ(summary["checkpoints"]["taken"].get<int64_t>(), 0) << summary.dump();
  EXPECT_NE(summary["checkpoints"]["last_error"].get<std::string>().find("server 0"), std::string::npos)
      << summary.dump();
  EXPECT_GT(summary["steps"].get<int64_t>(), 100) << "training stopped";
}

// A job within the limits that this worker's machine still cannot hold (here: a worker whose address space is
// capped at 2 GiB, asked for a 1 GiB model it keeps several copies of): the worker fails with an error, not an
// abort, and the job's records name its allocation failure.
TEST_F(FailuresTest, AWorkerThatCannotAllocateTheModelFailsNamingIt) {
#if TESSERA_HAS_ADDRESS_SANITIZER
  GTEST_SKIP() << "AddressSanitizer reserves more address space than the cap this test sets";
#else
  const std::string job = Write("job.pbtxt", R"(
name: "too-big-for-this-worker"
model { mlp { hidden_sizes: [16384, 16384] } }
data { format: SYNTHETIC synthetic_train_examples: 1024 synthetic_features: 64 synthetic_classes: 8 }
batch_size: 16
consistency { mode: ASYNC }
stop { max_steps: 10 }
cluster { num_servers: 1 num_workers: 1 }
)");
  const std::filesystem::path run = dir_ / "run";
  Subprocess scheduler({kBin + "/tessera-scheduler", "--job=" + job, "--run_dir=" + run.string(),
                        "--heartbeat_interval_ms=100", "--heartbeat_timeout_ms=1500"});
  ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
  const std::string address = SchedulerAddress(scheduler.output());
  Subprocess server({kBin + "/tessera-server", "--scheduler=" + address});
  Subprocess worker({"/bin/sh", "-c", "ulimit -v 2097152; exec \"$0\" \"$@\"", kBin + "/tessera-worker",
                     "--scheduler=" + address, "--device=cpu"});
  ASSERT_TRUE(worker.ReadUntilExit(absl::Seconds(60))) << worker.output();
  EXPECT_EQ(worker.exit_code(), 1) << "an allocation failure is an error, not an abort:\n" << worker.output();
  EXPECT_NE(worker.output().find("RESOURCE_EXHAUSTED"), std::string::npos) << worker.output();
  ASSERT_TRUE(scheduler.ReadUntilExit(absl::Seconds(60))) << scheduler.output();
  const nlohmann::json summary = ReadJson(run / "summary.json");
  ASSERT_TRUE(summary.is_object()) << scheduler.output();
  EXPECT_NE(summary["stop_reason"].get<std::string>().find("RESOURCE_EXHAUSTED"), std::string::npos)
      << summary.dump();
#endif
}

// --resume of a checkpoint written by a job of the same name but another model (or optimizer, or seed) is
// refused at start, naming the field, before anything listens or any worker joins; a resume that changes only
// what may change (here: the stop condition) starts.
TEST_F(FailuresTest, AResumeOfAnotherModelsCheckpointIsRefusedAtStart) {
  const std::filesystem::path checkpoints = dir_ / "checkpoints";
  const std::string ran = Job("SYNC", 1, 1, 3000) + absl::StrCat("checkpoint { dir: \"", checkpoints.string(),
                                                                "\" every_steps: 200 }\n");
  {
    Subprocess launch({kBin + "/tessera-launch", "--linger_s=0", "--job=" + Write("ran.pbtxt", ran),
                       "--run_dir=" + (dir_ / "first").string(), "--device=cpu"});
    ASSERT_TRUE(launch.ReadUntilExit(absl::Seconds(120))) << launch.output();
    ASSERT_EQ(launch.exit_code(), 0) << launch.output();
  }
  std::string other = ran;
  other.replace(other.find("hidden_sizes: 32"), 16, "hidden_sizes: 48");
  Subprocess refused({kBin + "/tessera-scheduler", "--job=" + Write("other.pbtxt", other),
                      "--resume=" + checkpoints.string(), "--run_dir=" + (dir_ / "first").string()});
  ASSERT_TRUE(refused.ReadUntilExit(absl::Seconds(30))) << refused.output();
  EXPECT_EQ(refused.exit_code(), 2) << refused.output();
  EXPECT_NE(refused.output().find("job field model differs"), std::string::npos) << refused.output();
  EXPECT_NE(refused.output().find("hidden_sizes: 48"), std::string::npos) << refused.output();
  EXPECT_EQ(refused.output().find("listening"), std::string::npos) << refused.output();

  std::string longer = ran;
  longer.replace(longer.find("max_steps: 3000"), 15, "max_steps: 4000");
  Subprocess resumed({kBin + "/tessera-scheduler", "--job=" + Write("longer.pbtxt", longer),
                      "--resume=" + checkpoints.string(), "--run_dir=" + (dir_ / "first").string()});
  EXPECT_TRUE(resumed.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << resumed.output();
}

// A server killed during a job with no checkpoint to restore its chunks from: the job stops at once with a reason
// naming the server, and the scheduler exits non-zero. Nobody hangs.
TEST_F(FailuresTest, AServerLostWithoutACheckpointStopsTheJobNamingIt) {
  const std::string job = Write("job.pbtxt", Job("ASYNC", 2, 1, 1000000));
  const std::filesystem::path run = dir_ / "run";
  Subprocess scheduler(Concat({kBin + "/tessera-scheduler", "--job=" + job, "--run_dir=" + run.string()},
                              kFastHeartbeats));
  ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
  const std::string address = SchedulerAddress(scheduler.output());
  Subprocess server0({kBin + "/tessera-server", "--scheduler=" + address});
  ASSERT_TRUE(scheduler.ReadUntilLine("server 0 at ", absl::Seconds(30))) << scheduler.output();
  Subprocess server1({kBin + "/tessera-server", "--scheduler=" + address});
  Subprocess worker({kBin + "/tessera-worker", "--scheduler=" + address, "--device=cpu"});
  ASSERT_TRUE(scheduler.ReadUntilLine("step    200 |", absl::Seconds(60))) << scheduler.output();
  kill(server1.pid(), SIGKILL);
  ASSERT_TRUE(scheduler.ReadUntilExit(absl::Seconds(60))) << scheduler.output();
  EXPECT_EQ(scheduler.exit_code(), 3) << scheduler.output();
  EXPECT_NE(scheduler.output().find("server 1 at 127.0.0.1:"), std::string::npos) << scheduler.output();
  const nlohmann::json summary = ReadJson(run / "summary.json");
  ASSERT_TRUE(summary.is_object()) << scheduler.output();
  EXPECT_FALSE(summary["completed"].get<bool>());
  EXPECT_NE(summary["stop_reason"].get<std::string>().find("server 1 at"), std::string::npos) << summary.dump();
  EXPECT_GT(summary["pushes"].get<int64_t>(), 0) << "counters survive the lost server: " << summary.dump();
  ASSERT_TRUE(worker.ReadUntilExit(absl::Seconds(60))) << worker.output();
  ASSERT_TRUE(server0.ReadUntilExit(absl::Seconds(60))) << server0.output();
}

// kill -9 of a server during a SYNC job that takes checkpoints: within the heartbeat timeout its chunks move to
// the other server, restored from the latest checkpoint, every worker goes back to that checkpoint's clock, and
// the job ends with the parameters of an uninterrupted run. The summary records the recovery.
class ServerLossTest : public FailuresTest, public ::testing::WithParamInterface<std::string> {};

// kill -9 of a server mid-run, while pushes and exchanges flow to it (over gRPC, or over UCX): the scheduler
// restores its chunks on the other server from the newest checkpoint, the SYNC job rolls back to it, and it ends
// with the parameters of an undisturbed run.
TEST_P(ServerLossTest, ALostServerIsRecoveredFromTheLatestCheckpoint) {
  const std::string job = Write("job.pbtxt", Job("SYNC", 2, 2, 4000, /*momentum=*/0.9f, GetParam()));
  ASSERT_NO_FATAL_FAILURE(RunUndisturbed(job));

  const std::filesystem::path run = dir_ / "run";
  const std::string dump = (dir_ / "run.params").string();
  Subprocess launch({kBin + "/tessera-launch", "--linger_s=0", "--job=" + job, "--run_dir=" + run.string(), "--device=cpu",
                     "--checkpoint_every_steps=300", "--heartbeat_timeout_ms=1500", "--dump_params=" + dump});
  ASSERT_TRUE(launch.ReadUntilLine("step   1500 |", absl::Seconds(120))) << launch.output();
  const int server = OnlyProcess("tessera-server", SchedulerAddress(launch.output()), 1);
  ASSERT_GT(server, 0);
  kill(server, SIGKILL);
  ASSERT_TRUE(launch.ReadUntilExit(absl::Seconds(120))) << launch.output();
  ASSERT_EQ(launch.exit_code(), 0) << launch.output();

  const nlohmann::json summary = ReadJson(run / "summary.json");
  EXPECT_TRUE(summary["completed"].get<bool>()) << summary.dump();
  bool recovered = false;
  for (const auto& e : summary["events"]) {
    if (e["event"] == "server lost, recovered") {
      recovered = true;
      EXPECT_GT(e["chunks_moved"].get<int>(), 0) << e.dump();
      EXPECT_TRUE(e["rolled_back_to"].is_number()) << e.dump();
    }
  }
  EXPECT_TRUE(recovered) << summary.dump();
  ExpectTheUndisturbedParameters(dump);
}

INSTANTIATE_TEST_SUITE_P(Transports, ServerLossTest, ::testing::Values(std::string("GRPC"), std::string("UCX")),
                         [](const auto& info) { return info.param; });

// The same SYNC job over gRPC and over UCX (shared memory or cross-memory attach on this host) ends with the same
// parameters: the transport moves the values and changes none.
TEST_F(FailuresTest, AUcxRunEndsWithTheParametersOfAGrpcRun) {
  ASSERT_NO_FATAL_FAILURE(RunUndisturbed(Write("job.pbtxt", Job("SYNC", 2, 2, 600, /*momentum=*/0.9f))));
  const std::string job = Write("ucx.pbtxt", Job("SYNC", 2, 2, 600, /*momentum=*/0.9f, "UCX"));
  const std::filesystem::path run = dir_ / "ucx";
  const std::string dump = (dir_ / "ucx.params").string();
  Subprocess launch({kBin + "/tessera-launch", "--linger_s=0", "--job=" + job, "--run_dir=" + run.string(),
                     "--device=cpu", "--dump_params=" + dump});
  ASSERT_TRUE(launch.ReadUntilExit(absl::Seconds(120))) << launch.output();
  ASSERT_EQ(launch.exit_code(), 0) << launch.output();
  ExpectTheUndisturbedParameters(dump);
  std::ifstream log(run / "logs/server-0.log");
  const std::string server_log((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(server_log.find("; UCX (no TCP port)"), std::string::npos) << server_log;
}

// A UCX job whose servers run without UCX (--fabric=false): every worker fails at its first chunk call with a
// message that names the server and what to do, and the launcher exits non-zero; nothing hangs.
TEST_F(FailuresTest, AUcxJobWithoutAFabricListenerFailsNamingTheServer) {
  const std::string job = Write("job.pbtxt", Job("SYNC", 1, 1, 100, 0, "UCX"));
  Subprocess scheduler({kBin + "/tessera-scheduler", "--job=" + job});
  ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
  const std::string address = SchedulerAddress(scheduler.output());
  Subprocess server({kBin + "/tessera-server", "--scheduler=" + address, "--fabric=false"});
  Subprocess worker({kBin + "/tessera-worker", "--scheduler=" + address, "--device=cpu"});
  ASSERT_TRUE(worker.ReadUntilExit(absl::Seconds(60))) << worker.output();
  EXPECT_NE(worker.exit_code(), 0);
  EXPECT_NE(worker.output().find("has no UCX"), std::string::npos) << worker.output();
}

// The scheduler killed mid-run: servers and workers exit within the heartbeat timeout, naming its address.
TEST_F(FailuresTest, EveryoneExitsNamingTheSchedulerWhenItDies) {
  const std::string job = Write("job.pbtxt", Job("SYNC", 1, 1, 1000000));
  Subprocess scheduler(Concat({kBin + "/tessera-scheduler", "--job=" + job}, kFastHeartbeats));
  ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
  const std::string address = SchedulerAddress(scheduler.output());
  Subprocess server({kBin + "/tessera-server", "--scheduler=" + address});
  Subprocess worker({kBin + "/tessera-worker", "--scheduler=" + address, "--device=cpu"});
  ASSERT_TRUE(scheduler.ReadUntilLine("step    200 |", absl::Seconds(60))) << scheduler.output();
  kill(scheduler.pid(), SIGKILL);
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(server.ReadUntilExit(absl::Seconds(30))) << server.output();
  ASSERT_TRUE(worker.ReadUntilExit(absl::Seconds(30))) << worker.output();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(15));
  EXPECT_NE(server.exit_code(), 0);
  EXPECT_NE(worker.exit_code(), 0);
  EXPECT_NE(server.output().find("lost the scheduler at " + address), std::string::npos) << server.output();
  EXPECT_NE(worker.output().find(address), std::string::npos) << worker.output();
}

// The scheduler killed mid-run (so everyone stops), then `tessera-launch --resume=RUN_DIR`: the sync job goes
// on from its newest checkpoint and ends with the parameters an uninterrupted run of the same job ends with. The
// newest checkpoint is damaged first: it is refused with a message naming the file and the check, and the one
// before it is used.
TEST_F(FailuresTest, AResumedSyncRunEndsWithTheParametersOfAnUninterruptedOne) {
  const std::string job = Write("job.pbtxt", Job("SYNC", 2, 2, 3000, /*momentum=*/0.9f));
  ASSERT_NO_FATAL_FAILURE(RunUndisturbed(job));

  const std::filesystem::path run = dir_ / "cut";
  const std::string dump = (dir_ / "cut.params").string();
  {
    Subprocess cut({kBin + "/tessera-launch", "--linger_s=0", "--job=" + job, "--run_dir=" + run.string(), "--device=cpu",
                    "--checkpoint_every_steps=300", "--dump_params=" + dump});
    ASSERT_TRUE(cut.ReadUntilLine("step   1500 |", absl::Seconds(120))) << cut.output();
    const int scheduler = OnlyProcess("tessera-scheduler", run.string());
    ASSERT_GT(scheduler, 0);
    kill(scheduler, SIGKILL);
    ASSERT_TRUE(cut.ReadUntilExit(absl::Seconds(60))) << cut.output();
    EXPECT_NE(cut.exit_code(), 0) << cut.output();
  }
  // Damage the newest checkpoint: one of its server files loses its last bytes.
  std::vector<std::filesystem::path> folders;
  for (const auto& e : std::filesystem::directory_iterator(run / "checkpoints")) folders.push_back(e.path());
  ASSERT_GE(folders.size(), 2u);
  std::sort(folders.begin(), folders.end());
  const std::filesystem::path damaged = folders.back() / "server-1.shard";
  std::filesystem::resize_file(damaged, std::filesystem::file_size(damaged) - 3);

  Subprocess resumed({kBin + "/tessera-launch", "--linger_s=0", "--resume=" + run.string(), "--device=cpu", "--dump_params=" + dump});
  ASSERT_TRUE(resumed.ReadUntilExit(absl::Seconds(120))) << resumed.output();
  ASSERT_EQ(resumed.exit_code(), 0) << resumed.output();
  std::ifstream log(run / "logs/scheduler.log");
  const std::string scheduler_log((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(scheduler_log.find(damaged.string() + " is refused: the payload is"), std::string::npos) << scheduler_log;
  EXPECT_NE(scheduler_log.find("resuming job 'failures' from " + folders[folders.size() - 2].string()),
            std::string::npos)
      << scheduler_log;

  ExpectTheUndisturbedParameters(dump);
  const nlohmann::json summary = ReadJson(run / "summary.json");
  EXPECT_TRUE(summary["completed"].get<bool>()) << summary.dump();
  EXPECT_EQ(summary["steps"], 3000);
}

}  // namespace
}  // namespace tessera::testing
