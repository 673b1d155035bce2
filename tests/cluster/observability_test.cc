// What a person or Prometheus sees of a running cluster: /healthz, /metrics, /status over HTTP.
#include <httplib.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cluster/mini_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"
#include "worker/worker.h"

namespace tessera::testing {
namespace {

std::string Get(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(10, 0);
  client.set_connection_timeout(10, 0);
  httplib::Result result = client.Get(path.c_str());
  if (!result || result->status != 200) return "";
  return result->body;
}

TEST(ObservabilityTest, DaemonsServeHealthMetricsAndStatus) {
  auto cluster = MiniCluster::Start(TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/1));
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Declare({FloatParam("w", 10)}), IsOk());  // 40 bytes: one chunk, on server 0
  std::vector<float> grad(10, 1.0f);
  ASSERT_THAT((*client)->Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());

  Server& holder = (*cluster)->server((*client)->shard_map()->chunks(0).server_id());
  ASSERT_GT(holder.http_port(), 0);
  EXPECT_EQ(Get(holder.http_port(), "/healthz"), "ok\n");
  const std::string metrics = Get(holder.http_port(), "/metrics");
  const std::string server = absl::StrCat("server=\"", holder.id(), "\"");
  EXPECT_NE(metrics.find("# HELP tessera_server_pushes_total "), std::string::npos) << metrics;
  EXPECT_NE(metrics.find(absl::StrCat("tessera_server_pushes_total{", server, "} 1\n")), std::string::npos) << metrics;
  // Staleness is a real histogram: cumulative buckets, +Inf, sum and count.
  EXPECT_NE(metrics.find("# TYPE tessera_server_update_staleness_clocks histogram"), std::string::npos) << metrics;
  for (const char* le : {"0", "1", "63", "+Inf"}) {
    EXPECT_NE(metrics.find(absl::StrCat("tessera_server_update_staleness_clocks_bucket{", server, ",le=\"", le, "\"} 1\n")),
              std::string::npos)
        << le << "\n" << metrics;
  }
  EXPECT_NE(metrics.find(absl::StrCat("tessera_server_update_staleness_clocks_count{", server, "} 1\n")), std::string::npos);
  EXPECT_NE(metrics.find(absl::StrCat("tessera_server_update_staleness_clocks_sum{", server, "} 0\n")), std::string::npos);

  const int scheduler_port = (*cluster)->scheduler().http_port();
  ASSERT_GT(scheduler_port, 0);
  nlohmann::json status = nlohmann::json::parse(Get(scheduler_port, "/status"));
  EXPECT_EQ(status["mode"], "async");
  EXPECT_EQ(status["servers"].size(), 2u);
  EXPECT_EQ(status["workers"].size(), 1u);
  EXPECT_EQ(status["shard_map_epoch"], 1);
  EXPECT_TRUE(status["history"].is_array());
  EXPECT_NE(Get(scheduler_port, "/").find("<title>Tessera dashboard</title>"), std::string::npos);
  EXPECT_NE(Get(scheduler_port, "/metrics").find("tessera_scheduler_worker_clock{worker=\"0\"} 0"), std::string::npos);
}

// Every daemon's /metrics passes Prometheus' own linter (promtool, from Debian's prometheus package; the test is
// skipped where it is not installed).
TEST(ObservabilityTest, EveryMetricsPagePassesPromtool) {
  if (std::system("promtool --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "promtool is not installed (Debian: prometheus)";
  auto cluster = MiniCluster::Start(TestJob(tessera::v1::ConsistencySpec::SSP, /*servers=*/2, /*workers=*/2));
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Declare({FloatParam("w", 10)}), IsOk());
  std::vector<float> grad(10, 1.0f);
  ASSERT_THAT((*client)->Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());

  TrainerProgress progress;
  progress.clock = 3;
  progress.samples = 96;
  std::vector<std::pair<std::string, std::string>> pages = {
      {"scheduler", Get((*cluster)->scheduler().http_port(), "/metrics")},
      {"worker", WorkerMetricsText(progress, 1)}};
  for (int s = 0; s < 2; ++s) pages.emplace_back(absl::StrCat("server ", s), Get((*cluster)->server(s).http_port(), "/metrics"));
  for (const auto& [who, page] : pages) {
    ASSERT_FALSE(page.empty()) << who;
    const std::string file = ::testing::TempDir() + "/metrics.txt";
    std::ofstream(file) << page;
    Subprocess lint({"/bin/sh", "-c", "exec promtool check metrics < " + file});
    ASSERT_TRUE(lint.ReadUntilExit(absl::Seconds(60))) << who << ": promtool did not finish";
    EXPECT_EQ(lint.exit_code(), 0) << who << ": " << lint.output() << "\n" << page;
    EXPECT_EQ(lint.output(), "") << who << ": " << page;
  }
}

}  // namespace
}  // namespace tessera::testing
