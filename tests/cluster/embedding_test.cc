// Embedding tables through the client library against a real in-process cluster (real gRPC): rows spread over
// the servers by hash slot, SYNC steps that mix rows and dense parameters, and a table larger than one server's
// row memory trained across several.
#include <cmath>
#include <thread>
#include <vector>

#include "common/model/shard_map.h"
#include "gtest/gtest.h"
#include "server/tables/sparse_table.h"
#include "tests/cluster/mini_cluster.h"
#include "tests/testing/status_matchers.h"

namespace tessera::testing {
namespace {

tessera::v1::ParameterSpec EmbeddingTable(int64_t dim) {
  tessera::v1::ParameterSpec p;
  p.set_name("emb");
  p.set_dtype(tessera::v1::DT_FLOAT32);
  p.add_shape(dim);
  p.mutable_init()->set_kind(tessera::v1::InitSpec::UNIFORM);
  p.mutable_init()->set_scale(0.1f);
  p.mutable_init()->set_seed(3);
  p.mutable_embedding()->set_slots(16);
  p.mutable_embedding()->mutable_optimizer()->set_learning_rate(0.5f);
  return p;
}

tessera::v1::ParameterSpec Dense() {
  tessera::v1::ParameterSpec p;
  p.set_name("w");
  p.set_dtype(tessera::v1::DT_FLOAT32);
  p.add_shape(4);
  return p;
}

int64_t RowsOn(Server& server) {
  tessera::v1::ServerStats stats = server.store().Stats();
  return stats.tables_size() == 0 ? 0 : stats.tables(0).rows();
}

// Two workers, two servers, SYNC: each step pushes its rows (a batch with repeated ids), then exchanges the dense
// parameter, whose round closes only once both workers' rows are in; the next pull sees the mean of their
// gradients applied, on rows that live on both servers. Over gRPC and over UCX, where the rows take the fabric.
class EmbeddingTransportTest : public ::testing::TestWithParam<tessera::v1::Transport> {};

TEST_P(EmbeddingTransportTest, SyncStepsMixRowsAndDenseParametersAcrossServers) {
  tessera::v1::JobSpec job = TestJob(tessera::v1::ConsistencySpec::SYNC, /*servers=*/2, /*workers=*/2);
  job.set_transport(GetParam());
  job.set_trusted_network(GetParam() == tessera::v1::UCX);
  auto cluster = MiniCluster::Start(job);
  ASSERT_THAT(cluster, IsOk());
  constexpr int64_t kDim = 8;
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int w = 0; w < 2; ++w) {
    auto client = (*cluster)->ConnectClient();
    ASSERT_THAT(client, IsOk());
    clients.push_back(*std::move(client));
  }
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 40; ++i) ids.push_back(i * 1000003);
  // Before any gradient every row holds its initial values.
  std::vector<float> before(ids.size() * kDim);
  const tessera::v1::ParameterSpec table = EmbeddingTable(kDim);
  for (size_t i = 0; i < ids.size(); ++i) {
    FillRowInit(table.init(), "emb", ids[i], absl::MakeSpan(before.data() + i * kDim, kDim));
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(2);
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      PsClient& c = *clients[w];
      results[w] = c.Declare({Dense(), table});
      if (!results[w].ok()) return;
      for (int step = 0; step < 3; ++step) {
        // Worker w's batch: every id, the first one twice; gradient w + 1 per row (so 2(w + 1) for the first).
        std::vector<uint64_t> batch = ids;
        batch.push_back(ids[0]);
        std::vector<float> grads(batch.size() * kDim, static_cast<float>(w + 1));
        absl::StatusOr<PsClient::RowsPushed> pushed = c.PushRows("emb", batch, grads, /*batch_size=*/8);
        if (!pushed.ok()) {
          results[w] = pushed.status();
          return;
        }
        std::vector<float> dense_grad(4, 1.0f), dense(4);
        results[w] = c.PushPull({"w"}, {absl::MakeConstSpan(dense_grad)}, 8, {absl::MakeSpan(dense)});
        if (!results[w].ok()) return;
        absl::StatusOr<ClockResult> clock = c.Clock();
        if (!clock.ok()) {
          results[w] = clock.status();
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_THAT(results[0], IsOk());
  ASSERT_THAT(results[1], IsOk());
  std::vector<float> after(ids.size() * kDim);
  ASSERT_THAT(clients[0]->PullRows("emb", ids, absl::MakeSpan(after)), IsOk());
  // Per step the mean gradient is (1 + 2) / 2 = 1.5 per row (3 for ids[0], sent twice by each); lr 0.5; 3 steps.
  for (size_t i = 0; i < ids.size(); ++i) {
    const float step = i == 0 ? 3.0f : 1.5f;
    for (int64_t j = 0; j < kDim; ++j) {
      ASSERT_NEAR(after[i * kDim + j], before[i * kDim + j] - 3 * 0.5f * step, 1e-4) << "row " << i << " [" << j << "]";
    }
  }
  EXPECT_GT(RowsOn((*cluster)->server(0)), 0);
  EXPECT_GT(RowsOn((*cluster)->server(1)), 0);
  EXPECT_EQ(RowsOn((*cluster)->server(0)) + RowsOn((*cluster)->server(1)), 40);
  for (int s = 0; s < 2; ++s) {
    const FabricService* fabric = (*cluster)->server(s).fabric();
    if (GetParam() == tessera::v1::UCX) {
      ASSERT_NE(fabric, nullptr);
      // Each worker's 3 pushes and the final pull reached both servers over UCX.
      EXPECT_GE(fabric->row_requests(), 7) << "server " << s;
    } else {
      EXPECT_EQ(fabric, nullptr);
    }
  }
}

// A batch of 50,000 distinct ids (400 KB of ids alone: far beyond a UCX message header) pushed and pulled back;
// the pull leaves as several calls per server (RowCaller cuts a route of many ids), each row where it belongs.
TEST_P(EmbeddingTransportTest, ALargeBatchOfRowsTravels) {
  tessera::v1::JobSpec job = TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/1);
  job.set_transport(GetParam());
  job.set_trusted_network(GetParam() == tessera::v1::UCX);
  auto cluster = MiniCluster::Start(job);
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  constexpr int64_t kDim = 4;
  tessera::v1::ParameterSpec table = EmbeddingTable(kDim);
  table.mutable_init()->set_kind(tessera::v1::InitSpec::ZEROS);
  ASSERT_THAT((*client)->Declare({table}), IsOk());
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 50000; ++i) ids.push_back((i + 1) * 0x9E3779B97F4A7C15ULL);
  std::vector<float> grads(ids.size() * kDim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i % 7);
  absl::StatusOr<PsClient::RowsPushed> pushed = (*client)->PushRows("emb", ids, grads, /*batch_size=*/1);
  ASSERT_THAT(pushed, IsOk());
  EXPECT_EQ(pushed->updated, static_cast<int64_t>(ids.size()));
  std::vector<float> rows(ids.size() * kDim);
  ASSERT_THAT((*client)->PullRows("emb", ids, absl::MakeSpan(rows)), IsOk());
  for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i], -0.5f * grads[i]) << i;  // lr 0.5, from zero
}

INSTANTIATE_TEST_SUITE_P(Transports, EmbeddingTransportTest, ::testing::Values(tessera::v1::GRPC, tessera::v1::UCX),
                         [](const auto& info) { return tessera::v1::Transport_Name(info.param); });

// A table three times one server's row memory: refused on one server, with nothing applied; trained on four.
TEST(EmbeddingTest, ATableLargerThanOneServersMemoryTrainsAcrossServers) {
  constexpr int64_t kDim = 16;
  tessera::v1::ParameterSpec table = EmbeddingTable(kDim);
  absl::StatusOr<std::shared_ptr<const RowTableSpec>> spec = RowTableFromDeclaration(table, /*delta_checkpoints=*/false);
  ASSERT_THAT(spec, IsOk());
  const int64_t rows_per_mb = (int64_t{1} << 20) / (*spec)->RowBytes();
  std::vector<uint64_t> ids(3 * rows_per_mb);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i * 2654435761u;
  const std::vector<float> grads(ids.size() * kDim, 0.25f);
  for (int servers : {1, 4}) {
    SCOPED_TRACE(servers);
    auto cluster = MiniCluster::Start(TestJob(tessera::v1::ConsistencySpec::ASYNC, servers, 1), absl::Minutes(5), {},
                                      /*server_row_memory_mb=*/1);
    ASSERT_THAT(cluster, IsOk());
    auto client = (*cluster)->ConnectClient();
    ASSERT_THAT(client, IsOk());
    ASSERT_THAT((*client)->Declare({table}), IsOk());
    absl::StatusOr<PsClient::RowsPushed> pushed = (*client)->PushRows("emb", ids, grads, 8);
    int64_t rows = 0;
    for (int s = 0; s < servers; ++s) rows += RowsOn((*cluster)->server(s));
    if (servers == 1) {
      EXPECT_THAT(pushed, StatusIs(absl::StatusCode::kResourceExhausted, "row memory"));
      EXPECT_EQ(rows, 0);
      continue;
    }
    ASSERT_THAT(pushed, IsOk());
    EXPECT_EQ(pushed->updated, static_cast<int64_t>(ids.size()));
    EXPECT_EQ(rows, static_cast<int64_t>(ids.size()));
  }
}

}  // namespace
}  // namespace tessera::testing
