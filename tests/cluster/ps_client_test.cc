// The client library against a real in-process cluster.
#include "gtest/gtest.h"
#include "tests/cluster/mini_cluster.h"
#include "tests/testing/status_matchers.h"

namespace tessera::testing {
namespace {

TEST(PsClientTest, UnchangedChunksArePulledWithoutBytes) {
  auto cluster = MiniCluster::Start(TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/1));
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  PsClient& c = **client;
  tessera::v1::ParameterSpec p;
  p.set_name("w");
  p.set_dtype(tessera::v1::DT_FLOAT32);
  p.add_shape(1000);
  p.mutable_init()->set_kind(tessera::v1::InitSpec::UNIFORM);
  p.mutable_init()->set_scale(1.0f);
  ASSERT_THAT(c.Declare({p}), IsOk());
  ASSERT_GT(c.shard_map()->chunks_size(), 1);

  std::vector<float> values(1000), other(1000);
  ASSERT_THAT(c.Pull({"w"}, {absl::MakeSpan(values)}), IsOk());
  EXPECT_EQ(c.bytes_pulled(), 4000);
  const std::vector<float> first = values;
  ASSERT_THAT(c.Pull({"w"}, {absl::MakeSpan(values)}), IsOk());
  EXPECT_EQ(c.bytes_pulled(), 4000) << "nothing changed and the memory holds it: nothing should travel";
  EXPECT_EQ(values, first);

  ASSERT_THAT(c.Pull({"w"}, {absl::MakeSpan(other)}), IsOk());
  EXPECT_EQ(c.bytes_pulled(), 8000) << "other memory does not hold the values: every byte travels";
  EXPECT_EQ(other, first);
  c.ForgetPulledValues();
  ASSERT_THAT(c.Pull({"w"}, {absl::MakeSpan(other)}), IsOk());
  EXPECT_EQ(c.bytes_pulled(), 12000);

  std::vector<float> grad(1000, 1.0f);
  ASSERT_THAT(c.Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());
  ASSERT_THAT(c.Pull({"w"}, {absl::MakeSpan(values)}), IsOk());
  EXPECT_EQ(c.bytes_pulled(), 16000) << "a pull after a push always moves bytes";
  EXPECT_FLOAT_EQ(values[0], first[0] - 0.1f);  // TestJob: SGD, lr 0.1
}

TEST(PsClientTest, PushPullReturnsTheValuesAfterTheUpdate) {
  auto cluster = MiniCluster::Start(TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/1));
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  tessera::v1::ParameterSpec p;
  p.set_name("w");
  p.set_dtype(tessera::v1::DT_FLOAT32);
  p.add_shape(500);  // zeros, chunks on both servers
  ASSERT_THAT((*client)->Declare({p}), IsOk());
  std::vector<float> grad(500, 2.0f), values(500, 7.0f);
  ASSERT_THAT((*client)->PushPull({"w"}, {absl::MakeConstSpan(grad)}, 1, {absl::MakeSpan(values)}), IsOk());
  for (float v : values) ASSERT_FLOAT_EQ(v, -0.2f);  // 0 - lr 0.1 * 2
}

}  // namespace
}  // namespace tessera::testing
