// Bad input over real gRPC: a clear error, and nothing changed.
#include <limits>

#include "common/rpc/grpc_status.h"
#include "common/rpc/rpc.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"
#include "gtest/gtest.h"
#include "tests/cluster/mini_cluster.h"
#include "tests/testing/ports.h"
#include "tests/testing/status_matchers.h"

namespace tessera::testing {
namespace {

using tessera::v1::ConsistencySpec;

tessera::v1::ParameterSpec Param(const std::string& name, int64_t n) {
  tessera::v1::ParameterSpec p;
  p.set_name(name);
  p.set_dtype(tessera::v1::DT_FLOAT32);
  p.add_shape(n);
  p.mutable_init()->set_kind(tessera::v1::InitSpec::UNIFORM);
  p.mutable_init()->set_scale(1.0f);
  p.mutable_init()->set_seed(3);
  return p;
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = MiniCluster::Start(TestJob(ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/2));
    ASSERT_THAT(cluster, IsOk());
    cluster_ = std::move(*cluster);
    auto client = cluster_->ConnectClient();
    ASSERT_THAT(client, IsOk());
    client_ = std::move(*client);
    ASSERT_THAT(client_->Declare({Param("w", 100)}), IsOk());
    const tessera::v1::ShardMap& map = *client_->shard_map();
    stub_ = tessera::v1::ParameterServer::NewStub(MakeChannel(map.servers(map.chunks(0).server_id()).address(), *Security::Plaintext()));
  }

  // A raw push of `values` to chunk 0 of "w".
  absl::Status RawPush(const std::string& param, std::vector<float> values, uint64_t epoch = 0) {
    const tessera::v1::ShardMap& map = *client_->shard_map();
    tessera::v1::PushRequest request;
    request.set_epoch(epoch == 0 ? map.epoch() : epoch);
    request.set_worker_id(client_->worker_id());
    request.set_incarnation(client_->incarnation());
    request.set_seq(++seq_);
    request.set_batch_size(1);
    request.mutable_key()->set_param(param);
    request.mutable_key()->set_index(0);
    EncodeFloats(values, request.mutable_data());
    grpc::ClientContext context;
    SetTimeout(context, absl::Seconds(10));
    ActAs(*client_, context);
    tessera::v1::PushResponse response;
    return FromGrpcStatus(stub_->Push(&context, request, &response), context, "push");
  }

  std::vector<float> Values() {
    std::vector<float> values(100);
    EXPECT_THAT(client_->Pull({"w"}, {absl::MakeSpan(values)}), IsOk());
    return values;
  }

  int64_t Chunk0Length() { return client_->shard_map()->chunks(0).length(); }

  std::unique_ptr<MiniCluster> cluster_;
  std::unique_ptr<PsClient> client_;
  std::unique_ptr<tessera::v1::ParameterServer::Stub> stub_;
  uint64_t seq_ = 100;
};

TEST_F(BadInputTest, UnknownParameterIsNotFound) {
  tessera::v1::PullRequest request;
  request.set_epoch(client_->epoch());
  request.mutable_key()->set_param("no_such_param");
  grpc::ClientContext context;
  SetTimeout(context, absl::Seconds(10));
  tessera::v1::PullResponse response;
  EXPECT_THAT(FromGrpcStatus(stub_->Pull(&context, request, &response), context, "pull"),
              StatusIs(absl::StatusCode::kNotFound, "no_such_param"));
  std::vector<float> values(3);
  EXPECT_THAT(client_->Pull({"no_such_param"}, {absl::MakeSpan(values)}),
              StatusIs(absl::StatusCode::kNotFound, "no_such_param"));
}

TEST_F(BadInputTest, WrongByteLengthIsInvalidArgumentAndChangesNothing) {
  const std::vector<float> before = Values();
  EXPECT_THAT(RawPush("w", std::vector<float>(Chunk0Length() + 1, 1.0f)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("expected ", Chunk0Length() * 4, " bytes")));
  std::vector<float> wrong_shape(99, 0.0f);
  EXPECT_THAT(client_->Push({"w"}, {absl::MakeConstSpan(wrong_shape)}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "shape [100]"));
  EXPECT_EQ(Values(), before);
}

TEST_F(BadInputTest, NonFiniteGradientIsInvalidArgumentAndParametersAreUnchanged) {
  const std::vector<float> before = Values();
  std::vector<float> grad(100, 0.5f);
  grad[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(client_->Push({"w"}, {absl::MakeConstSpan(grad)}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "finite"));
  grad[7] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(client_->Push({"w"}, {absl::MakeConstSpan(grad)}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, "finite"));
  std::vector<float> chunk(Chunk0Length(), 0.5f);
  chunk.back() = -std::numeric_limits<float>::infinity();
  EXPECT_THAT(RawPush("w", chunk), StatusIs(absl::StatusCode::kInvalidArgument, "finite"));
  const std::vector<float> after = Values();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) ASSERT_EQ(after[i], before[i]) << "element " << i;
}

TEST_F(BadInputTest, StaleEpochIsFailedPreconditionAndTheClientFollows) {
  ASSERT_EQ(client_->epoch(), 1u);
  // A second worker joins (epoch 2) and declares another parameter (epoch 3).
  auto other = cluster_->ConnectClient();
  ASSERT_THAT(other, IsOk());
  ASSERT_THAT((*other)->Declare({Param("w", 100), Param("extra", 50)}), IsOk());
  ASSERT_EQ((*other)->epoch(), 3u);

  absl::Status raw = RawPush("w", std::vector<float>(Chunk0Length(), 0.0f), /*epoch=*/1);
  EXPECT_THAT(raw, StatusIs(absl::StatusCode::kFailedPrecondition, "stale shard map"));
  EXPECT_EQ(GetCurrentEpoch(raw), std::optional<uint64_t>(3));

  // The client library still holds epoch 1: it is told the current epoch, refreshes, and succeeds.
  std::vector<float> grad(100, 0.25f);
  const std::vector<float> before = Values();  // this pull already follows the epoch
  EXPECT_EQ(client_->epoch(), 3u);
  EXPECT_THAT(client_->Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());
  const std::vector<float> after = Values();
  EXPECT_FLOAT_EQ(after[0], before[0] - 0.1f * 0.25f);
}

TEST_F(BadInputTest, StaleEpochPushIsFollowedByTheClient) {
  auto other = cluster_->ConnectClient();
  ASSERT_THAT(other, IsOk());
  ASSERT_THAT((*other)->Declare({Param("w", 100), Param("extra", 50)}), IsOk());
  ASSERT_EQ(client_->epoch(), 1u);
  std::vector<float> grad(100, 0.25f);
  EXPECT_THAT(client_->Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());
  EXPECT_EQ(client_->epoch(), 3u);
}

TEST(UnreachableSchedulerTest, ClientAndServerGiveUpNamingTheAddress) {
  const std::string address = absl::StrCat("127.0.0.1:", UnusedLoopbackPort());
  PsClient::Options options;
  options.scheduler_address = address;
  options.connect_timeout = absl::Seconds(2);
  options.heartbeat = false;
  EXPECT_THAT(PsClient::Connect(options), StatusIs(absl::StatusCode::kUnavailable, address));
  ServerOptions server_options;
  server_options.scheduler_address = address;
  server_options.connect_timeout_s = 1;
  EXPECT_THAT(Server::Start(server_options), StatusIs(absl::StatusCode::kUnavailable, address));
}

TEST(PlacementTest, TensorSpanningAllServersRoundTripsExactly) {
  tessera::v1::JobSpec job = TestJob(ConsistencySpec::ASYNC, /*servers=*/3, /*workers=*/1);
  job.set_chunk_bytes(16384);
  auto cluster = MiniCluster::Start(job);
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Declare({Param("big", 100003)}), IsOk());
  std::set<int> servers;
  for (const auto& c : (*client)->shard_map()->chunks()) servers.insert(c.server_id());
  EXPECT_EQ(servers.size(), 3u);
  std::vector<float> values(100003);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 1.0e-3f - 7.25f;
  ASSERT_THAT((*client)->Assign({"big"}, {absl::MakeConstSpan(values)}), IsOk());
  std::vector<float> back(values.size());
  ASSERT_THAT((*client)->Pull({"big"}, {absl::MakeSpan(back)}), IsOk());
  EXPECT_EQ(back, values);
}

}  // namespace
}  // namespace tessera::testing
