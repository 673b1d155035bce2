// The daemons as a service manager (systemd, Kubernetes, Slurm) and an operator see them: SIGTERM is a graceful
// stop that exits 0, flags are checked and named, a daemon started before its scheduler joins within a second or
// two, --version, the gRPC health service, and the dashboard that outlives the job for --linger_s.
#include <signal.h>

#include <filesystem>
#include <fstream>

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/security.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/daemon_test.h"
#include "tests/testing/ports.h"
#include "tests/testing/raw_rpc.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/daemon_security.h"

namespace tessera::testing {
namespace {

using ServiceTest = DaemonTest;

constexpr char kLongJob[] = R"(
name: "long"
model { mlp { hidden_sizes: 16 } }
data { format: SYNTHETIC }
consistency { mode: SYNC }
stop { max_steps: 100000000 }
eval_every_steps: 50
cluster { num_servers: 1 num_workers: 2 }
)";

// SIGTERM to the scheduler of a running job: a checkpoint, the workers' last step, a summary naming the signal,
// and every daemon exits 0.
TEST_F(ServiceTest, SigtermStopsTheJobGracefullyAndEveryDaemonExitsZero) {
  const std::string run = (dir_ / "run").string();
  const std::string checkpoints = (dir_ / "checkpoints").string();
  Subprocess scheduler({kBin + "/tessera-scheduler", "--job=" + Write("long.pbtxt", kLongJob), "--run_dir=" + run,
                        "--checkpoint_dir=" + checkpoints});
  ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
  const std::string address = SchedulerAddress(scheduler.output());
  Subprocess server({kBin + "/tessera-server", "--scheduler=" + address});
  Subprocess worker0({kBin + "/tessera-worker", "--scheduler=" + address, "--device=cpu"});
  Subprocess worker1({kBin + "/tessera-worker", "--scheduler=" + address, "--device=cpu"});
  ASSERT_TRUE(scheduler.ReadUntilLine("step    100 |", absl::Seconds(120))) << scheduler.output();

  kill(scheduler.pid(), SIGTERM);
  ASSERT_TRUE(scheduler.ReadUntilExit(absl::Seconds(60))) << scheduler.output();
  EXPECT_EQ(scheduler.exit_code(), 0) << scheduler.output();
  for (Subprocess* daemon : {&server, &worker0, &worker1}) {
    ASSERT_TRUE(daemon->ReadUntilExit(absl::Seconds(60))) << daemon->output();
    EXPECT_EQ(daemon->exit_code(), 0) << daemon->output();
  }
  const nlohmann::json summary = ReadJson(run + "/summary.json");
  ASSERT_TRUE(summary.is_object()) << scheduler.output();
  EXPECT_EQ(summary["stop_reason"], "stopped by SIGTERM");
  EXPECT_EQ(summary["completed"], false);
  EXPECT_GE(summary["steps"].get<int64_t>(), 100);
  EXPECT_TRUE(std::filesystem::exists(checkpoints + "/ckpt-000001")) << "no checkpoint before stopping";
}

// SIGTERM to a server or worker on its own (a pod deleted, a unit stopped) exits 0, also while it still waits
// for its scheduler.
TEST_F(ServiceTest, SigtermToAServerOrWorkerExitsZeroEvenWhileWaitingForTheScheduler) {
  const std::string nobody = absl::StrCat("127.0.0.1:", UnusedLoopbackPort());
  Subprocess server({kBin + "/tessera-server", "--scheduler=" + nobody});
  Subprocess worker({kBin + "/tessera-worker", "--scheduler=" + nobody, "--device=cpu"});
  for (Subprocess* daemon : {&server, &worker}) {
    ASSERT_TRUE(daemon->ReadUntil("waiting for the scheduler at " + nobody, absl::Seconds(30))) << daemon->output();
    kill(daemon->pid(), SIGTERM);
    ASSERT_TRUE(daemon->ReadUntilExit(absl::Seconds(10))) << daemon->output();
    EXPECT_EQ(daemon->exit_code(), 0) << daemon->output();
  }
}

// Every daemon kind started seconds before its scheduler, over plaintext and over mutual TLS, says once that it
// waits and registers within a few seconds of the scheduler coming up (not after gRPC's own reconnect backoff,
// which grows to minutes, and not never: a worker, which serves no gRPC of its own, once polled its connection
// only inside calls that failed at once, so a TLS handshake never finished).
struct EarlyStart {
  std::string daemon;  // "server" or "worker"
  bool tls;
};

void PrintTo(const EarlyStart& e, std::ostream* os) { *os << e.daemon << (e.tls ? " over TLS" : " over plaintext"); }

class EarlyStartTest : public DaemonTest, public ::testing::WithParamInterface<EarlyStart> {};

TEST_P(EarlyStartTest, ADaemonStartedBeforeTheSchedulerRegistersWithinSecondsOfIt) {
  const EarlyStart& param = GetParam();
  absl::StatusOr<DaemonSecurity> security = DaemonSecurity::Make(
      dir_.string(), "early", Write("token", "an-early-start-token-of-this-test\n"), param.tls);
  ASSERT_TRUE(security.ok()) << security.status();
  const int port = UnusedLoopbackPort();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::vector<std::string> daemon_argv = {kBin + "/tessera-" + param.daemon, "--scheduler=" + address,
                                          "--connect_timeout_s=60"};
  if (param.daemon == "worker") daemon_argv.push_back("--device=cpu");
  Subprocess daemon(security->On(daemon_argv));
  ASSERT_TRUE(daemon.ReadUntil("waiting for the scheduler", absl::Seconds(30))) << daemon.output();
  absl::SleepFor(absl::Seconds(6));  // long enough for an unbounded backoff to have grown past several seconds
  Subprocess scheduler(security->On({kBin + "/tessera-scheduler", "--job=" + Write("long.pbtxt", kLongJob),
                                      absl::StrCat("--port=", port), "--run_dir=" + (dir_ / "run").string()}));
  ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
  const absl::Time up = absl::Now();
  ASSERT_TRUE(scheduler.ReadUntil(param.daemon + " 0 ", absl::Seconds(30))) << scheduler.output() << daemon.output();
  ASSERT_TRUE(scheduler.ReadUntil("registered", absl::Seconds(30))) << scheduler.output() << daemon.output();
  EXPECT_LT(absl::Now() - up, absl::Seconds(3)) << daemon.output();
  const std::string& out = daemon.output();
  const size_t first = out.find("waiting for the scheduler");
  EXPECT_EQ(out.find("waiting for the scheduler", first + 1), std::string::npos) << "one waiting line:\n" << out;
}

INSTANTIATE_TEST_SUITE_P(EveryDaemonKind, EarlyStartTest,
                         ::testing::Values(EarlyStart{"server", false}, EarlyStart{"server", true},
                                           EarlyStart{"worker", false}, EarlyStart{"worker", true}),
                         [](const ::testing::TestParamInfo<EarlyStart>& info) {
                           return info.param.daemon + (info.param.tls ? "OverTls" : "OverPlaintext");
                         });

TEST_F(ServiceTest, BadFlagsAndStrayArgumentsExitTwoNamingTheFlag) {
  const std::string job = Write("long.pbtxt", kLongJob);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{kBin + "/tessera-scheduler", "--job=" + job, "--port=99999"}, "--port"},
      {{kBin + "/tessera-scheduler", "--job=" + job, "--heartbeat_interval_ms=0"}, "--heartbeat_interval_ms"},
      {{kBin + "/tessera-scheduler", "--job=" + job, "--http_port=-2"}, "--http_port"},
      {{kBin + "/tessera-scheduler", "--job=" + job, "extra"}, "'extra'"},
      {{kBin + "/tessera-scheduler", "--job=" + job, "--checkpoint_dir=" + job}, "is not a folder"},
      {{kBin + "/tessera-scheduler", "--job=" + job, "--checkpoint_dir=" + job + "/sub"}, "cannot be created"},
      {{"/usr/bin/env", "TESSERA_PORT=abc", kBin + "/tessera-scheduler", "--job=" + job}, "TESSERA_PORT"},
      {{kBin + "/tessera-server", "--scheduler=127.0.0.1:1", "--update_threads=0"}, "--update_threads"},
      {{kBin + "/tessera-server", "--scheduler=127.0.0.1:1", "--connect_timeout_s=0"}, "--connect_timeout_s"},
      {{kBin + "/tessera-worker", "--scheduler=127.0.0.1:1", "--rank=-3"}, "--rank"},
      {{kBin + "/tessera-worker", "--scheduler=127.0.0.1:1", "--bogus=1"}, "--bogus"},
      {{kBin + "/tessera-launch", "--workers=-1"}, "--workers"},
      {{kBin + "/tessera-launch", "job.pbtxt"}, "'job.pbtxt'"},
  };
  for (const auto& [argv, named] : cases) {
    Subprocess bad(argv);
    ASSERT_TRUE(bad.ReadUntilExit(absl::Seconds(30))) << argv[0];
    EXPECT_EQ(bad.exit_code(), 2) << argv.back() << ": " << bad.output();
    EXPECT_NE(bad.output().find(named), std::string::npos) << bad.output();
  }
}

TEST_F(ServiceTest, EveryProgramPrintsItsVersionAndCommitAndItsOwnHelp) {
  const std::vector<std::pair<std::string, std::string>> programs = {
      {"tessera-scheduler", "-linger_s"}, {"tessera-server", "-connect_timeout_s"}, {"tessera-worker", "-rank_offset"},
      {"tessera-launch", "-overwrite"}, {"tessera-example-linear-regression", "-features"},
      {"tessera-bench", "-sections"}};
  for (const auto& [program, own_flag] : programs) {
    Subprocess version({kBin + "/" + program, "--version"});
    ASSERT_TRUE(version.ReadUntilExit(absl::Seconds(30))) << program;
    EXPECT_EQ(version.exit_code(), 0) << program;
    EXPECT_NE(version.output().find(absl::StrCat(program, " ")), std::string::npos) << version.output();
    EXPECT_NE(version.output().find("(commit "), std::string::npos) << version.output();
    Subprocess help({kBin + "/" + program, "--help"});
    ASSERT_TRUE(help.ReadUntilExit(absl::Seconds(30))) << program;
    EXPECT_EQ(help.exit_code(), 0) << program;
    EXPECT_NE(help.output().find(own_flag), std::string::npos) << help.output();
    EXPECT_NE(help.output().find("TESSERA_"), std::string::npos) << help.output();
    Subprocess helpshort({kBin + "/" + program, "--helpshort"});  // gflags' other help flags: the same page
    ASSERT_TRUE(helpshort.ReadUntilExit(absl::Seconds(30))) << program;
    EXPECT_EQ(helpshort.exit_code(), 0) << program;
    EXPECT_NE(helpshort.output().find(own_flag), std::string::npos) << helpshort.output();
    EXPECT_EQ(help.output().find("-logtostderr"), std::string::npos) << program << " lists library flags";
  }
}

// Flags from the environment, the command line winning; the gRPC health service answers SERVING.
TEST_F(ServiceTest, EnvironmentConfiguresADaemonAndTheHealthServiceAnswers) {
  const int port = UnusedLoopbackPort();
  Subprocess scheduler({"/usr/bin/env", absl::StrCat("TESSERA_PORT=", port), "TESSERA_JOB=" + Write("long.pbtxt", kLongJob),
                        "TESSERA_HTTP_PORT=-1", kBin + "/tessera-scheduler", "--run_dir=" + (dir_ / "run").string()});
  ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
  EXPECT_EQ(SchedulerAddress(scheduler.output()), absl::StrCat("127.0.0.1:", port));
  EXPECT_EQ(scheduler.output().find("dashboard at"), std::string::npos) << "TESSERA_HTTP_PORT=-1 turns HTTP off";
  std::string reply;
  ASSERT_TRUE(RawUnary(MakeChannel(absl::StrCat("127.0.0.1:", port), *Security::Plaintext()),
                       "/grpc.health.v1.Health/Check", std::string(), {}, &reply)
                  .ok());
  EXPECT_EQ(reply, std::string("\x08\x01", 2)) << "HealthCheckResponse{status: SERVING}";
}

// The launcher: the dashboard's address at start; after the job the dashboard stays, says "finished" with the
// reason, and Ctrl-C leaves with 0 (the job completed); a second run into the same directory is refused unless
// --overwrite.
TEST_F(ServiceTest, LauncherShowsTheDashboardLingersAndRefusesAUsedRunDirectory) {
  const std::string job = Write("short.pbtxt", R"(
model { mlp { hidden_sizes: 16 } }
data { format: SYNTHETIC }
stop { max_steps: 20 }
eval_every_steps: 10
cluster { num_servers: 1 num_workers: 1 }
)");
  const std::string run = (dir_ / "run").string();
  Subprocess launch({kBin + "/tessera-launch", "--job=" + job, "--run_dir=" + run, "--device=cpu", "--linger_s=120"});
  ASSERT_TRUE(launch.ReadUntilLine("the job has ended", absl::Seconds(120))) << launch.output();
  const std::string marker = "dashboard at http://127.0.0.1:";
  const size_t at = launch.output().find(marker);
  ASSERT_NE(at, std::string::npos) << launch.output();
  const int http_port = std::stoi(launch.output().substr(at + marker.size()));
  httplib::Client client("127.0.0.1", http_port);
  httplib::Result status = client.Get("/status");
  ASSERT_TRUE(status && status->status == 200) << launch.output();
  const nlohmann::json json = nlohmann::json::parse(status->body);
  EXPECT_EQ(json["finished"], true);
  EXPECT_EQ(json["completed"], true);
  EXPECT_NE(json["stop_reason"].get<std::string>().find("last step"), std::string::npos) << json.dump();
  kill(launch.pid(), SIGINT);
  ASSERT_TRUE(launch.ReadUntilExit(absl::Seconds(20))) << launch.output();
  EXPECT_EQ(launch.exit_code(), 0) << launch.output();

  Subprocess again({kBin + "/tessera-launch", "--job=" + job, "--run_dir=" + run, "--device=cpu", "--linger_s=0"});
  ASSERT_TRUE(again.ReadUntilExit(absl::Seconds(30)));
  EXPECT_EQ(again.exit_code(), 2) << again.output();
  EXPECT_NE(again.output().find("already holds a run"), std::string::npos) << again.output();
  Subprocess overwrite({kBin + "/tessera-launch", "--job=" + job, "--run_dir=" + run, "--device=cpu", "--linger_s=0",
                        "--overwrite"});
  ASSERT_TRUE(overwrite.ReadUntilExit(absl::Seconds(120))) << overwrite.output();
  EXPECT_EQ(overwrite.exit_code(), 0) << overwrite.output();
  EXPECT_EQ(ReadJson(run + "/summary.json")["completed"], true);
}

}  // namespace
}  // namespace tessera::testing
