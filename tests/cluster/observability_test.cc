// What a person or Prometheus sees of a running cluster: /healthz, /metrics, /status over HTTP.
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cluster/mini_cluster.h"
#include "tests/testing/status_matchers.h"

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
  tessera::v1::ParameterSpec p;
  p.set_name("w");
  p.set_dtype(tessera::v1::DT_FLOAT32);
  p.add_shape(10);  // 40 bytes: one chunk, on server 0
  ASSERT_THAT((*client)->Declare({p}), IsOk());
  std::vector<float> grad(10, 1.0f);
  ASSERT_THAT((*client)->Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());

  Server& holder = (*cluster)->server((*client)->shard_map()->chunks(0).server_id());
  ASSERT_GT(holder.http_port(), 0);
  EXPECT_EQ(Get(holder.http_port(), "/healthz"), "ok\n");
  const std::string metrics = Get(holder.http_port(), "/metrics");
  EXPECT_NE(metrics.find("tessera_server_pushes_total 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("tessera_server_staleness_updates{staleness=\"0\"} 1"), std::string::npos) << metrics;

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

}  // namespace
}  // namespace tessera::testing
