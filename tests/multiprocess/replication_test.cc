// Replication (ReplicationSpec) with real processes killed by signal: kill -9 of a server loses no acknowledged
// update. In ASYNC and SSP a client that pushes known gradients and counts its acknowledgements finds their sum
// in the values; a SYNC job ends with the parameters of an undisturbed run, bit for bit; neither needs a
// checkpoint, and the loss is acted on before the heartbeat timeout.
#include <signal.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <fstream>
#include <thread>
#include <tuple>

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/model/shard_map.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/daemon_test.h"
#include "tests/testing/param_spec.h"
#include "tests/testing/subprocess.h"
#include "worker/client/ps_client.h"
#include "worker/param_file.h"

namespace tessera::testing {
namespace {

// Long enough that only a worker's report can explain a recovery within it.
constexpr int kHeartbeatTimeoutMs = 20000;

// The tessera-server processes of the scheduler at `address`, oldest first.
std::vector<int> ServerProcesses(const std::string& address) {
  std::vector<int> servers;
  for (int pid : ProcessesMentioning("tessera-server")) {
    for (int other : ProcessesMentioning(address)) {
      if (pid == other) servers.push_back(pid);
    }
  }
  std::sort(servers.begin(), servers.end());
  return servers;
}

// A scheduler (heartbeat timeout kHeartbeatTimeoutMs; with `dashboard`, its HTTP port in http_port), servers 0, 1
// and 2, and a client of rank 0.
struct ThreeServers {
  std::unique_ptr<Subprocess> scheduler;
  std::vector<std::unique_ptr<Subprocess>> servers;
  std::unique_ptr<PsClient> client;
  std::string address;  // the scheduler's
  int http_port = 0;

  void Start(const std::string& job, const std::string& run_dir, bool dashboard = false) {
    std::vector<std::string> command = {kBin + "/tessera-scheduler", "--job=" + job, "--run_dir=" + run_dir,
                                        "--heartbeat_interval_ms=100",
                                        absl::StrCat("--heartbeat_timeout_ms=", kHeartbeatTimeoutMs)};
    if (dashboard) command.push_back("--http_port=0");
    scheduler = std::make_unique<Subprocess>(command);
    const std::string marker = "dashboard at http://127.0.0.1:";
    if (dashboard) {
      ASSERT_TRUE(scheduler->ReadUntilLine(marker, absl::Seconds(30))) << scheduler->output();
      http_port = std::atoi(scheduler->output().c_str() + scheduler->output().find(marker) + marker.size());
    }
    ASSERT_TRUE(scheduler->ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler->output();
    address = SchedulerAddress(scheduler->output());
    for (int i = 0; i < 3; ++i) {
      servers.push_back(std::make_unique<Subprocess>(
          std::vector<std::string>{kBin + "/tessera-server", "--scheduler=" + address, absl::StrCat("--id=", i)}));
    }
    PsClient::Options options;
    options.scheduler_address = address;
    options.rank = 0;
    absl::StatusOr<std::unique_ptr<PsClient>> connected = PsClient::Connect(options);
    ASSERT_TRUE(connected.ok()) << connected.status();
    client = *std::move(connected);
  }
};

// (consistency mode, transport)
class ReplicationTest : public DaemonTest,
                        public ::testing::WithParamInterface<std::tuple<std::string, std::string>> {
 protected:
  std::string mode() const { return std::get<0>(GetParam()); }
  std::string transport() const { return std::get<1>(GetParam()); }
  std::string TransportLine() const { return transport() == "UCX" ? "transport: UCX trusted_network: true\n" : ""; }
};

// One client pushes gradients of known values (small integers, so every sum is exact in float32) to 3 servers
// with one backup per chunk; server 1 is killed while the pushes flow. Every push the servers acknowledged is in
// the values, once: they equal minus the sum of the acknowledged gradients, element for element.
TEST_P(ReplicationTest, AKilledServerLosesNoAcknowledgedPush) {
  const std::string job = Write("job.pbtxt", absl::StrCat(TransportLine(), R"(
name: "replicated"
model { mlp { hidden_sizes: 8 } }
data { format: SYNTHETIC }
optimizer { kind: SGD learning_rate: 1 }
consistency { mode: )", mode(), mode() == "SSP" ? " staleness: 2" : "", R"( }
stop { max_steps: 1000000 }
chunk_bytes: 4096
cluster { num_servers: 3 num_workers: 1 }
replication { backups: 1 }
)"));
  ThreeServers cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.Start(job, (dir_ / "run").string()));
  Subprocess& scheduler = *cluster.scheduler;
  std::vector<std::unique_ptr<Subprocess>>& servers = cluster.servers;
  std::unique_ptr<PsClient>* client = &cluster.client;
  constexpr int kElements = 10000;  // 10 chunks of 1024 values
  ASSERT_TRUE((*client)->Declare({FloatParam("w", kElements)}).ok());

  std::atomic<bool> killed{false};
  absl::Time killed_at;
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(1500));
    killed_at = absl::Now();
    kill(servers[1]->pid(), SIGKILL);
    killed = true;
  });
  std::vector<double> expected(kElements, 0.0);
  std::vector<float> grad(kElements);
  absl::Duration longest_push;
  int acknowledged = 0, after_kill = 0;
  for (int i = 0; after_kill < 100; ++i) {
    for (int e = 0; e < kElements; ++e) grad[e] = static_cast<float>((i + e) % 5 + 1);
    const bool was_killed = killed;
    const absl::Time start = absl::Now();
    absl::Status pushed = (*client)->Push({"w"}, {grad}, /*batch_size=*/1);
    ASSERT_TRUE(pushed.ok()) << "push " << i << ": " << pushed;
    longest_push = std::max(longest_push, absl::Now() - start);
    ++acknowledged;
    after_kill += was_killed;
    for (int e = 0; e < kElements; ++e) expected[e] -= grad[e];
    if (mode() == "SSP") ASSERT_TRUE((*client)->Clock().ok());
  }
  killer.join();
  std::vector<float> values(kElements);
  ASSERT_TRUE((*client)->Pull({"w"}, {absl::MakeSpan(values)}).ok());
  int wrong = 0;
  for (int e = 0; e < kElements; ++e) wrong += values[e] != static_cast<float>(expected[e]);
  EXPECT_EQ(wrong, 0) << "of " << kElements << " values after " << acknowledged << " acknowledged pushes; w[0] = "
                      << values[0] << ", expected " << expected[0];
  // The failover did not wait for the heartbeat timeout: the longest push took far less.
  EXPECT_LT(longest_push, absl::Milliseconds(kHeartbeatTimeoutMs / 2));
  std::cout << "acknowledged pushes " << acknowledged << " (" << after_kill << " after the kill); longest push "
            << absl::FormatDuration(longest_push) << std::endl;
  ASSERT_TRUE(scheduler.ReadUntilLine("backups took over", absl::Seconds(10))) << scheduler.output();
}

INSTANTIATE_TEST_SUITE_P(ModesAndTransports, ReplicationTest,
                         ::testing::Combine(::testing::Values(std::string("ASYNC"), std::string("SSP")),
                                            ::testing::Values(std::string("GRPC"), std::string("UCX"))),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param), "_over_", std::get<1>(info.param));
                         });

// The same for an embedding table's rows: one client pushes row gradients of known values (a batch of 4000 ids
// with repeats, SGD lr 1, rows starting at zero) to 3 servers with one backup per hash slot; server 1 is killed
// while the pushes flow. Every acknowledged row update is in the rows, once. Over gRPC and over UCX (the rows'
// calls take the job's fabric).
class RowReplicationTest : public DaemonTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(RowReplicationTest, AKilledServerLosesNoAcknowledgedRowUpdate) {
  const std::string job = Write("job.pbtxt", absl::StrCat(GetParam() == "UCX" ? "transport: UCX trusted_network: true\n" : "", R"(
name: "replicated-rows"
model { mlp { hidden_sizes: 8 } }
data { format: SYNTHETIC }
optimizer { kind: SGD learning_rate: 1 }
consistency { mode: ASYNC }
stop { max_steps: 1000000 }
cluster { num_servers: 3 num_workers: 1 }
replication { backups: 1 }
)"));
  ThreeServers cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.Start(job, (dir_ / "run").string()));
  Subprocess& scheduler = *cluster.scheduler;
  std::vector<std::unique_ptr<Subprocess>>& servers = cluster.servers;
  std::unique_ptr<PsClient>* client = &cluster.client;
  constexpr int64_t kDim = 4;
  tessera::v1::ParameterSpec table = FloatParam("rows", kDim);
  table.mutable_embedding()->set_slots(24);
  table.mutable_embedding()->mutable_optimizer()->set_learning_rate(1.0f);
  ASSERT_TRUE((*client)->Declare({table}).ok());

  constexpr int kIds = 3000;
  std::vector<uint64_t> batch;
  for (uint64_t id = 0; id < kIds; ++id) batch.push_back(id * 7 + 1);
  for (uint64_t id = 0; id < 1000; ++id) batch.push_back(id * 7 + 1);  // the first 1000 ids twice
  std::atomic<bool> killed{false};
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(1500));
    kill(servers[1]->pid(), SIGKILL);
    killed = true;
  });
  std::vector<double> expected(kIds * kDim, 0.0);
  std::vector<float> grads(batch.size() * kDim);
  absl::Duration longest_push;
  int acknowledged = 0, after_kill = 0;
  for (int i = 0; after_kill < 100; ++i) {
    for (size_t r = 0; r < batch.size(); ++r) {
      for (int64_t j = 0; j < kDim; ++j) grads[r * kDim + j] = static_cast<float>((i + r + j) % 5 + 1);
    }
    const bool was_killed = killed;
    const absl::Time start = absl::Now();
    absl::StatusOr<PsClient::RowsPushed> pushed = (*client)->PushRows("rows", batch, grads, /*batch_size=*/1);
    ASSERT_TRUE(pushed.ok()) << "push " << i << ": " << pushed.status();
    longest_push = std::max(longest_push, absl::Now() - start);
    ++acknowledged;
    after_kill += was_killed;
    for (size_t r = 0; r < batch.size(); ++r) {
      for (int64_t j = 0; j < kDim; ++j) expected[(r % kIds) * kDim + j] -= grads[r * kDim + j];
    }
  }
  killer.join();
  std::vector<float> rows(kIds * kDim);
  ASSERT_TRUE((*client)->PullRows("rows", absl::MakeConstSpan(batch.data(), kIds), absl::MakeSpan(rows)).ok());
  int wrong = 0;
  for (size_t e = 0; e < rows.size(); ++e) wrong += rows[e] != static_cast<float>(expected[e]);
  EXPECT_EQ(wrong, 0) << "of " << rows.size() << " values after " << acknowledged << " acknowledged pushes; row 0 = "
                      << rows[0] << ", expected " << expected[0];
  // The client told the scheduler of the server it could not reach: the failover did not wait for the heartbeat
  // timeout.
  EXPECT_LT(longest_push, absl::Milliseconds(kHeartbeatTimeoutMs / 2));
  std::cout << "acknowledged row pushes " << acknowledged << " (" << after_kill << " after the kill); longest push "
            << absl::FormatDuration(longest_push) << std::endl;
  ASSERT_TRUE(scheduler.ReadUntilLine("backups took over", absl::Seconds(10))) << scheduler.output();
}

INSTANTIATE_TEST_SUITE_P(Transports, RowReplicationTest, ::testing::Values(std::string("GRPC"), std::string("UCX")),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Units move live: while a client pushes gradients of known values (small integers: every sum is exact), server 1
// is drained (POST /drain: its units go to the others and it exits 0), then a new server joins and takes a share.
// No acknowledged update is lost, none is applied twice: every value is checked between two pushes after the
// drain and after the join. For an embedding table's slots ("rows") and a dense parameter's chunks ("dense").
// (It caught an update applied just before a view moved its unit away, then acknowledged: the moved-out copy had
// no backups left to wait for.)
class LiveMoveTest : public DaemonTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(LiveMoveTest, NoAcknowledgedUpdateIsLostWhenAServerIsDrainedAndAnotherJoins) {
  const bool rows_kind = GetParam() == "rows";
  const std::string job = Write("job.pbtxt", R"(
name: "moved-units"
model { mlp { hidden_sizes: 8 } }
data { format: SYNTHETIC }
optimizer { kind: SGD learning_rate: 1 }
consistency { mode: ASYNC }
stop { max_steps: 1000000 }
chunk_bytes: 4096
cluster { num_servers: 3 num_workers: 1 }
replication { backups: 1 }
)");
  ThreeServers cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.Start(job, (dir_ / "run").string(), /*dashboard=*/true));
  Subprocess& scheduler = *cluster.scheduler;
  std::vector<std::unique_ptr<Subprocess>>& servers = cluster.servers;
  std::unique_ptr<PsClient>* client = &cluster.client;
  const int http_port = cluster.http_port;
  const std::string& address = cluster.address;
  // rows: 3000 ids of dim 4 in 24 slots; dense: 12000 values in 12 chunks of 1024.
  constexpr int64_t kDim = 4;
  constexpr int kIds = 3000;
  constexpr int kSlots = 24;
  constexpr int kValues = kIds * kDim;
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; id < kIds; ++id) ids.push_back(id * 11 + 3);
  if (rows_kind) {
    tessera::v1::ParameterSpec table = FloatParam("rows", kDim);
    table.mutable_embedding()->set_slots(kSlots);
    table.mutable_embedding()->mutable_optimizer()->set_learning_rate(1.0f);
    ASSERT_TRUE((*client)->Declare({table}).ok());
  } else {
    ASSERT_TRUE((*client)->Declare({FloatParam("w", kValues)}).ok());
  }
  auto push = [&](const std::vector<float>& grads) -> absl::Status {
    if (!rows_kind) return (*client)->Push({"w"}, {grads}, /*batch_size=*/1);
    return (*client)->PushRows("rows", ids, grads, 1).status();
  };
  auto pull = [&](std::vector<float>& values) -> absl::Status {
    if (!rows_kind) return (*client)->Pull({"w"}, {absl::MakeSpan(values)});
    return (*client)->PullRows("rows", ids, absl::MakeSpan(values));
  };
  // The unit (slot or chunk) a value is in.
  auto unit_of = [&](int e) { return rows_kind ? EmbeddingSlot(ids[e / kDim], kSlots) : e / 1024; };

  std::atomic<bool> stop{false};
  std::atomic<int> acknowledged{0};
  std::vector<double> expected(kValues, 0.0);
  absl::Status push_error;
  absl::Mutex push_mu;  // held by a push and its expected values, or by a check of every value
  std::thread pusher([&] {
    std::vector<float> grads(kValues);
    for (int i = 0; !stop; ++i) {
      absl::MutexLock lock(&push_mu);
      for (size_t g = 0; g < grads.size(); ++g) grads[g] = static_cast<float>((i + g) % 3 + 1);
      if (absl::Status pushed = push(grads); !pushed.ok()) {
        push_error = pushed;
        return;
      }
      for (size_t g = 0; g < grads.size(); ++g) expected[g] -= grads[g];
      ++acknowledged;
    }
  });
  struct StopPushing {  // also when an assertion below ends the test early
    std::atomic<bool>& stop;
    std::thread& pusher;
    ~StopPushing() {
      stop = true;
      if (pusher.joinable()) pusher.join();
    }
  } stop_pushing{stop, pusher};
  auto wait_for_pushes = [&](int more) {
    const int target = acknowledged + more;
    for (int i = 0; i < 600 && acknowledged < target && push_error.ok(); ++i) absl::SleepFor(absl::Milliseconds(50));
  };
  // Every value against the acknowledged pushes, between two pushes: the wrong units, with where they are now.
  auto check_values = [&](const std::string& when) {
    absl::MutexLock lock(&push_mu);
    ASSERT_TRUE(push_error.ok()) << push_error;
    std::vector<float> values(kValues);
    ASSERT_TRUE(pull(values).ok());
    int wrong = 0;
    std::map<int, std::string> wrong_units;  // unit -> its first wrong value
    for (int e = 0; e < kValues; ++e) {
      if (values[e] == static_cast<float>(expected[e])) continue;
      ++wrong;
      if (wrong_units.count(unit_of(e)) == 0) {
        wrong_units[unit_of(e)] = absl::StrCat(values[e], " (expected ", expected[e], ")");
      }
    }
    std::string units_text;
    for (const auto& [unit, first] : wrong_units) {
      absl::StrAppend(&units_text, "\n  unit ", unit, ": ", first);
      for (const auto& c : (*client)->shard_map()->chunks()) {
        if (c.index() == unit) absl::StrAppend(&units_text, " on server ", c.server_id());
      }
    }
    EXPECT_EQ(wrong, 0) << "of " << kValues << " values " << when << ", after " << acknowledged
                        << " acknowledged pushes; wrong" << units_text << "\nscheduler:\n" << scheduler.output();
  };
  wait_for_pushes(50);
  httplib::Client http("127.0.0.1", http_port);
  http.set_read_timeout(120, 0);
  httplib::Result drained = http.Post("/drain?server=1", "", "text/plain");
  ASSERT_TRUE(drained) << httplib::to_string(drained.error());
  ASSERT_EQ(drained->status, 200) << drained->body;
  EXPECT_TRUE(servers[1]->ReadUntilExit(absl::Seconds(30)));
  EXPECT_EQ(servers[1]->exit_code(), 0) << servers[1]->output();
  wait_for_pushes(50);
  ASSERT_NO_FATAL_FAILURE(check_values("after the drain"));
  Subprocess joiner({kBin + "/tessera-server", "--scheduler=" + address});
  ASSERT_TRUE(scheduler.ReadUntilLine(" chunks at cluster view epoch ", absl::Seconds(60))) << scheduler.output();
  wait_for_pushes(50);
  stop = true;
  pusher.join();
  ASSERT_NO_FATAL_FAILURE(check_values("after the join"));
  // The joined server holds units now.
  int64_t held_by_joiner = 0;
  for (const auto& c : (*client)->shard_map()->chunks()) held_by_joiner += c.server_id() == 1;
  EXPECT_GT(held_by_joiner, 0) << "the new server (id 1 again) is primary of no unit";
  std::cout << "acknowledged pushes " << acknowledged << std::endl;
}

INSTANTIATE_TEST_SUITE_P(Units, LiveMoveTest, ::testing::Values(std::string("rows"), std::string("dense")),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

class SyncReplicationTest : public DaemonTest, public ::testing::WithParamInterface<std::string> {};

// A SYNC job with one backup per chunk and no checkpoints, one of its 3 servers killed mid-run and started again:
// backups take over at the same version, nothing rolls back, the new process becomes a backup, and the job ends
// with the parameters of an undisturbed run, bit for bit.
TEST_P(SyncReplicationTest, AKilledServerChangesNoBitOfTheResult) {
  const std::string job = Write("job.pbtxt", absl::StrCat(std::string(GetParam()) == "UCX" ? "transport: UCX trusted_network: true\n" : "", R"(
name: "replicated"
model { mlp { hidden_sizes: 32 } }
data { format: SYNTHETIC synthetic_train_examples: 4096 synthetic_features: 64 synthetic_classes: 8 }
optimizer { kind: SGD learning_rate: 0.05 momentum: 0.9 }
batch_size: 16
consistency { mode: SYNC }
stop { max_steps: 1200 }
eval_every_steps: 100
chunk_bytes: 4096
cluster { num_servers: 3 num_workers: 2 }
replication { backups: 1 }
)"));
  const std::string undisturbed = (dir_ / "full.params").string();
  ASSERT_NO_FATAL_FAILURE(RunLaunched(job, undisturbed));
  const std::filesystem::path run = dir_ / "run";
  const std::string dump = (dir_ / "run.params").string();
  Subprocess launch({kBin + "/tessera-launch", "--linger_s=0", "--job=" + job, "--run_dir=" + run.string(),
                     "--device=cpu", absl::StrCat("--heartbeat_timeout_ms=", kHeartbeatTimeoutMs),
                     "--restart_servers=1", "--dump_params=" + dump});
  ASSERT_TRUE(launch.ReadUntilLine("step    600 |", absl::Seconds(120))) << launch.output();
  const std::vector<int> servers = ServerProcesses(SchedulerAddress(launch.output()));
  ASSERT_EQ(servers.size(), 3u);
  kill(servers[1], SIGKILL);
  ASSERT_TRUE(launch.ReadUntilExit(absl::Seconds(180))) << launch.output();
  ASSERT_EQ(launch.exit_code(), 0) << launch.output();

  const nlohmann::json summary = ReadJson(run / "summary.json");
  EXPECT_TRUE(summary["completed"].get<bool>()) << summary.dump();
  bool took_over = false;
  for (const auto& e : summary["events"]) {
    EXPECT_NE(e["event"], "server lost, recovered") << "a checkpoint restore: " << e.dump();
    if (e["event"] == "server lost, backups took over") {
      took_over = true;
      EXPECT_GT(e["chunks_promoted"].get<int>(), 0) << e.dump();
      EXPECT_EQ(e["clocks_lost"].get<int>(), 0) << e.dump();
      EXPECT_LT(e["seconds_lost"].get<double>(), kHeartbeatTimeoutMs / 2000.0) << "waited for the heartbeat timeout";
      std::cout << "failover: " << e.dump() << std::endl;
    }
  }
  EXPECT_TRUE(took_over) << summary.dump();
  bool rejoined = false;
  for (const auto& e : summary["events"]) rejoined |= e["event"] == "server joined, chunks moved to it";
  EXPECT_TRUE(rejoined) << summary.dump();
  ExpectIdenticalParameters(undisturbed, dump);
}

INSTANTIATE_TEST_SUITE_P(Transports, SyncReplicationTest, ::testing::Values(std::string("GRPC"), std::string("UCX")),
                         [](const auto& info) { return info.param; });

// POST /drain?server=1 on a running SYNC job (token required): server 1's chunks move to the others in two
// phases and it exits 0; then a new tessera-server started against the running job takes its slot and a share of
// the primaries. No step is rolled back, and the job ends with the parameters of an undisturbed run, bit for bit.
TEST_F(DaemonTest, AServerIsDrainedAndANewOneJoinsWithoutLosingAStep) {
  const std::string job = Write("job.pbtxt", R"(
name: "drained"
model { mlp { hidden_sizes: 32 } }
data { format: SYNTHETIC synthetic_train_examples: 4096 synthetic_features: 64 synthetic_classes: 8 }
optimizer { kind: SGD learning_rate: 0.05 momentum: 0.9 }
batch_size: 16
consistency { mode: SYNC }
stop { max_steps: 1600 }
eval_every_steps: 100
chunk_bytes: 4096
cluster { num_servers: 3 num_workers: 2 }
replication { backups: 1 }
)");
  const std::string undisturbed = (dir_ / "full.params").string();
  ASSERT_NO_FATAL_FAILURE(RunLaunched(job, undisturbed));
  const std::filesystem::path run = dir_ / "run";
  const std::string dump = (dir_ / "run.params").string();
  Subprocess launch({kBin + "/tessera-launch", "--linger_s=0", "--job=" + job, "--run_dir=" + run.string(),
                     "--device=cpu", "--dump_params=" + dump});
  const std::string marker = "dashboard at http://127.0.0.1:";
  ASSERT_TRUE(launch.ReadUntilLine(marker, absl::Seconds(60))) << launch.output();
  const int http_port = std::atoi(launch.output().c_str() + launch.output().find(marker) + marker.size());
  ASSERT_TRUE(launch.ReadUntilLine("step    400 |", absl::Seconds(120))) << launch.output();
  const std::string address = SchedulerAddress(launch.output());
  const std::vector<int> servers = ServerProcesses(address);
  ASSERT_EQ(servers.size(), 3u);

  httplib::Client client("127.0.0.1", http_port);
  client.set_read_timeout(120, 0);
  httplib::Result refused = client.Post("/drain?server=1");
  ASSERT_TRUE(refused) << httplib::to_string(refused.error());
  EXPECT_EQ(refused->status, 401) << "a drain without the job token";
  std::ifstream token_file(run / "secrets/token");
  std::string token;
  std::getline(token_file, token);
  ASSERT_FALSE(token.empty());
  httplib::Result drained = client.Post("/drain?server=1", {{"Authorization", "Bearer " + token}}, "", "text/plain");
  ASSERT_TRUE(drained) << httplib::to_string(drained.error());
  ASSERT_EQ(drained->status, 200) << drained->body;
  EXPECT_NE(drained->body.find("drained"), std::string::npos) << drained->body;
  // Server 1 exits (0: the launcher reports no failure, and reaps it).
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = kill(servers[1], 0) != 0;
    if (!gone) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(gone) << "the drained server did not exit";

  // A new server joins the running job.
  Subprocess joiner({kBin + "/tessera-server", "--scheduler=" + address, "--token_file=" + (run / "secrets/token").string()});
  ASSERT_TRUE(launch.ReadUntilExit(absl::Seconds(180))) << launch.output();
  ASSERT_EQ(launch.exit_code(), 0) << launch.output();
  EXPECT_EQ(launch.output().find("failed ("), std::string::npos) << launch.output();

  const nlohmann::json summary = ReadJson(run / "summary.json");
  EXPECT_TRUE(summary["completed"].get<bool>()) << summary.dump();
  bool was_drained = false, joined = false;
  for (const auto& e : summary["events"]) {
    EXPECT_NE(e["event"], "server lost, recovered") << e.dump();
    if (e["event"] == "server drained") {
      was_drained = true;
      EXPECT_GT(e["chunks_moved"].get<int>(), 0) << e.dump();
      std::cout << "drain: " << e.dump() << std::endl;
    }
    if (e["event"] == "server joined, chunks moved to it") {
      joined = true;
      EXPECT_GT(e["chunks_moved"].get<int>(), 0) << e.dump();
      std::cout << "join: " << e.dump() << std::endl;
    }
  }
  EXPECT_TRUE(was_drained) << summary.dump();
  EXPECT_TRUE(joined) << summary.dump();
  ExpectIdenticalParameters(undisturbed, dump);
}

}  // namespace
}  // namespace tessera::testing
