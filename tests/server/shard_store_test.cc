#include "server/shard_store.h"

#include <cmath>
#include <limits>

#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

// One parameter "w" of 6 elements in two chunks of 3, both on server 0; zeros to start; SGD lr 1.
class ShardStoreTest : public ::testing::Test {
 protected:
  void Assign(tessera::v1::ConsistencySpec::Mode mode, int workers) {
    job_.mutable_model()->mutable_softmax_regression();
    job_.mutable_optimizer()->set_kind(tessera::v1::OptimizerSpec::SGD);
    job_.mutable_optimizer()->set_learning_rate(1.0f);
    job_.mutable_consistency()->set_mode(mode);
    job_.mutable_cluster()->set_num_workers(workers);
    map_.set_epoch(1);
    auto* server = map_.add_servers();
    server->set_id(0);
    server->set_address("127.0.0.1:1");
    auto* p = map_.add_params();
    p->set_name("w");
    p->set_dtype(tessera::v1::DT_FLOAT32);
    p->add_shape(6);
    for (int i = 0; i < 2; ++i) {
      auto* c = map_.add_chunks();
      c->set_param("w");
      c->set_index(i);
      c->set_offset(3 * i);
      c->set_length(3);
      c->set_server_id(0);
    }
    ASSERT_THAT(store_.Assign(map_, job_, 0), IsOk());
  }

  tessera::v1::PushRequest Gradient(int worker, uint64_t seq, int64_t clock, std::vector<float> values,
                                    int batch = 1, int index = 0) {
    tessera::v1::PushRequest r;
    r.set_epoch(1);
    r.set_worker_id(worker);
    r.set_seq(seq);
    r.set_clock(clock);
    r.set_read_clock_version(clock);
    r.set_batch_size(batch);
    r.mutable_key()->set_param("w");
    r.mutable_key()->set_index(index);
    EncodeFloats(values, r.mutable_data());
    return r;
  }

  std::vector<float> Values(int index = 0) {
    tessera::v1::PullRequest r;
    r.set_epoch(1);
    r.mutable_key()->set_param("w");
    r.mutable_key()->set_index(index);
    r.set_have_version(-1);
    absl::StatusOr<tessera::v1::PullResponse> pulled = store_.Pull(r);
    EXPECT_THAT(pulled, IsOk());
    std::vector<float> out(3);
    EXPECT_THAT(DecodeFloats(pulled->data(), absl::MakeSpan(out), "w"), IsOk());
    return out;
  }

  tessera::v1::JobSpec job_;
  tessera::v1::ShardMap map_;
  ShardStore store_;
};

TEST_F(ShardStoreTest, AsyncPushAppliesSgdUpdateOnArrival) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 2);
  ASSERT_THAT(store_.Push(Gradient(0, 1, 0, {1, 2, 3})), IsOk());
  EXPECT_EQ(Values(), (std::vector<float>{-1, -2, -3}));
  EXPECT_EQ(Values(1), (std::vector<float>{0, 0, 0}));
}

TEST_F(ShardStoreTest, RepeatedSeqIsAppliedOnce) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  ASSERT_THAT(store_.Push(Gradient(0, 1, 0, {1, 1, 1})), IsOk());
  absl::StatusOr<tessera::v1::PushResponse> again = store_.Push(Gradient(0, 1, 0, {1, 1, 1}));
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(again->duplicate());
  EXPECT_EQ(Values(), (std::vector<float>{-1, -1, -1}));
  EXPECT_EQ(store_.Stats().duplicate_pushes(), 1);
}

TEST_F(ShardStoreTest, SyncRoundAppliesTheBatchWeightedMeanOnce) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  ASSERT_THAT(store_.Push(Gradient(0, 1, 0, {3, 3, 3}, /*batch=*/1)), IsOk());
  EXPECT_EQ(Values(), (std::vector<float>{0, 0, 0})) << "a round is applied only when complete";
  ASSERT_THAT(store_.Push(Gradient(1, 1, 0, {7, 7, 7}, /*batch=*/3)), IsOk());
  // (1 * 3 + 3 * 7) / 4 = 6
  EXPECT_EQ(Values(), (std::vector<float>{-6, -6, -6}));
}

TEST_F(ShardStoreTest, SyncLatePushIsCountedAndNotMixedIn) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 1);
  ASSERT_THAT(store_.Push(Gradient(0, 1, 0, {1, 1, 1})), IsOk());
  ASSERT_THAT(store_.Push(Gradient(0, 2, 0, {5, 5, 5})), IsOk());  // round 0 again, new seq: late
  EXPECT_EQ(Values(), (std::vector<float>{-1, -1, -1}));
  EXPECT_EQ(store_.Stats().late_pushes(), 1);
  EXPECT_THAT(store_.Push(Gradient(0, 3, 5, {1, 1, 1})),
              StatusIs(absl::StatusCode::kFailedPrecondition, "round 5 is not open"));
}

TEST_F(ShardStoreTest, StalenessIsClockMinusTheClockVersionRead) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 2);
  tessera::v1::PushRequest r = Gradient(0, 1, 4, {1, 1, 1});
  r.set_read_clock_version(1);
  ASSERT_THAT(store_.Push(r), IsOk());
  EXPECT_EQ(store_.Stats().staleness().max(), 3);
}

TEST_F(ShardStoreTest, StalenessAwareLearningRateDividesTheStepByTheStaleness) {
  job_.mutable_consistency()->set_staleness_aware_lr(true);
  Assign(tessera::v1::ConsistencySpec::ASYNC, 2);
  tessera::v1::PushRequest stale = Gradient(0, 1, 4, {8, 8, 8});
  stale.set_read_clock_version(0);  // staleness 4: the step is lr * g / 4
  ASSERT_THAT(store_.Push(stale), IsOk());
  EXPECT_EQ(Values(), (std::vector<float>{-2, -2, -2}));
  ASSERT_THAT(store_.Push(Gradient(1, 1, 0, {1, 1, 1})), IsOk());  // staleness 0: the full step
  EXPECT_EQ(Values(), (std::vector<float>{-3, -3, -3}));
}

TEST_F(ShardStoreTest, UnknownParameterIsNotFound) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  tessera::v1::PushRequest r = Gradient(0, 1, 0, {1, 1, 1});
  r.mutable_key()->set_param("nope");
  EXPECT_THAT(store_.Push(r), StatusIs(absl::StatusCode::kNotFound, "nope"));
}

TEST_F(ShardStoreTest, WrongByteLengthIsInvalidAndChangesNothing) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  EXPECT_THAT(store_.Push(Gradient(0, 1, 0, {1, 1})),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected 12 bytes (3 float32 values), got 8"));
  EXPECT_EQ(Values(), (std::vector<float>{0, 0, 0}));
}

TEST_F(ShardStoreTest, NonFiniteGradientIsInvalidAndChangesNothing) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  EXPECT_THAT(store_.Push(Gradient(0, 1, 0, {1, std::numeric_limits<float>::quiet_NaN(), 1})),
              StatusIs(absl::StatusCode::kInvalidArgument, "index 1"));
  EXPECT_THAT(store_.Push(Gradient(0, 2, 0, {1, 1, std::numeric_limits<float>::infinity()})),
              StatusIs(absl::StatusCode::kInvalidArgument, "index 2"));
  EXPECT_EQ(Values(), (std::vector<float>{0, 0, 0}));
  absl::StatusOr<tessera::v1::PushResponse> retried = store_.Push(Gradient(0, 1, 0, {1, 1, 1}));
  ASSERT_THAT(retried, IsOk());
  EXPECT_FALSE(retried->duplicate()) << "a rejected push does not use up its seq";
  EXPECT_EQ(Values(), (std::vector<float>{-1, -1, -1}));
}

TEST_F(ShardStoreTest, StaleEpochIsFailedPreconditionCarryingTheCurrentEpoch) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  map_.set_epoch(3);
  ASSERT_THAT(store_.Assign(map_, job_, 0), IsOk());
  absl::StatusOr<tessera::v1::PushResponse> pushed = store_.Push(Gradient(0, 1, 0, {1, 1, 1}));
  EXPECT_THAT(pushed, StatusIs(absl::StatusCode::kFailedPrecondition, "epoch 1"));
  EXPECT_EQ(GetCurrentEpoch(pushed.status()), std::optional<uint64_t>(3));
}

}  // namespace
}  // namespace tessera
