#include "server/shard_store.h"

#include "server/consistency/async_policy.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/model/job_spec.h"
#include "common/rpc/security.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"
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
    job_.mutable_stop()->set_max_steps(100);
    ApplyJobDefaults(job_);  // as the scheduler hands it out
    map_.set_epoch(1);
    auto* server = map_.add_servers();
    server->set_id(0);
    server->set_address("127.0.0.1:1");
    auto* p = map_.add_params();
    p->set_name("w");
    p->set_dtype(tessera::v1::DT_FLOAT32);
    p->add_shape(6);
    p->set_state(module_state_);
    for (int i = 0; i < 2; ++i) {
      auto* c = map_.add_chunks();
      c->set_param("w");
      c->set_index(i);
      c->set_offset(3 * i);
      c->set_length(3);
      c->set_server_id(0);
    }
    if (with_state_) {  // "s": module state of 3 elements, one chunk
      auto* s = map_.add_params();
      s->set_name("s");
      s->set_dtype(tessera::v1::DT_FLOAT32);
      s->add_shape(3);
      s->set_state(true);
      auto* c = map_.add_chunks();
      c->set_param("s");
      c->set_length(3);
      c->set_server_id(0);
    }
    ASSERT_THAT(store_.Assign(map_, job_, 0), IsOk());
  }

  // A push and its values; `param` is what push.address.param points at.
  struct TestPush {
    ChunkPush push;
    std::vector<float> values;
    std::string param = "w";
  };

  TestPush Gradient(int worker, uint64_t seq, int64_t clock, std::vector<float> values, int batch = 1,
                    int index = 0) {
    TestPush r;
    r.push.address.epoch = 1;
    r.push.address.index = index;
    r.push.worker_id = worker;
    r.push.seq = seq;
    r.push.clock = clock;
    r.push.read_clock_version = clock;
    r.push.batch_size = batch;
    r.values = std::move(values);
    return r;
  }

  absl::StatusOr<PushOutcome> Push(TestPush r) {
    r.push.address.param = r.param;
    return store_.Push(r.push, SpanPayload(r.values));
  }

  // Starts a PushPull; the returned slot is filled when the store answers.
  std::shared_ptr<std::optional<absl::StatusOr<ChunkValues>>> PushPull(TestPush r) {
    auto slot = std::make_shared<std::optional<absl::StatusOr<ChunkValues>>>();
    r.push.address.param = r.param;
    store_.PushPull(r.push, SpanPayload(r.values), std::make_shared<ExchangeWaiter>([slot](auto v) {
                      *slot = std::move(v);
                    }));
    return slot;
  }

  static std::vector<float> Floats(const ChunkValues& v) {
    std::vector<float> out(v.length / sizeof(float));
    if (v.bytes) std::memcpy(out.data(), v.bytes->data(), v.length);
    return out;
  }

  std::vector<float> Values(int index = 0) {
    absl::StatusOr<ChunkValues> pulled = store_.Pull(ChunkPull{{1, "w", index}, -1});
    EXPECT_THAT(pulled, IsOk());
    return pulled.ok() ? Floats(*pulled) : std::vector<float>();
  }

  tessera::v1::JobSpec job_;
  tessera::v1::ShardMap map_;
  bool module_state_ = false;  // the parameter is module state (ParameterSpec.state)
  bool with_state_ = false;    // a second parameter "s", module state
  ShardStore store_;
};

TEST_F(ShardStoreTest, AsyncPushAppliesSgdUpdateOnArrival) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 2);
  ASSERT_THAT(Push(Gradient(0, 1, 0, {1, 2, 3})), IsOk());
  EXPECT_EQ(Values(), (std::vector<float>{-1, -2, -3}));
  EXPECT_EQ(Values(1), (std::vector<float>{0, 0, 0}));
}

TEST_F(ShardStoreTest, RepeatedSeqIsAppliedOnce) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  ASSERT_THAT(Push(Gradient(0, 1, 0, {1, 1, 1})), IsOk());
  absl::StatusOr<PushOutcome> again = Push(Gradient(0, 1, 0, {1, 1, 1}));
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(again->duplicate);
  EXPECT_EQ(Values(), (std::vector<float>{-1, -1, -1}));
  EXPECT_EQ(store_.Stats().duplicate_pushes(), 1);
}

TEST_F(ShardStoreTest, SyncRoundAppliesTheBatchWeightedMeanOnce) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  ASSERT_THAT(Push(Gradient(0, 1, 0, {3, 3, 3}, /*batch=*/1)), IsOk());
  EXPECT_EQ(Values(), (std::vector<float>{0, 0, 0})) << "a round is applied only when complete";
  ASSERT_THAT(Push(Gradient(1, 1, 0, {7, 7, 7}, /*batch=*/3)), IsOk());
  // (1 * 3 + 3 * 7) / 4 = 6
  EXPECT_EQ(Values(), (std::vector<float>{-6, -6, -6}));
}

// A worker's initial values (an ASSIGN push) are not a round: the workers' first gradients, of clock 0, make
// round 0 after it, and a SYNC checkpoint of clock 1 takes the chunk once that round has closed.
TEST_F(ShardStoreTest, AnAssignmentInSyncSetsTheValuesWithoutMovingTheRound) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  TestPush init = Gradient(0, 1, 0, {5, 5, 5});
  init.push.assign = true;
  ASSERT_THAT(Push(init), IsOk());
  EXPECT_EQ(Values(), (std::vector<float>{5, 5, 5}));
  ASSERT_THAT(Push(Gradient(0, 2, 0, {1, 1, 1})), IsOk());
  absl::StatusOr<PushOutcome> second = Push(Gradient(1, 1, 0, {3, 3, 3}));
  ASSERT_THAT(second, IsOk());
  EXPECT_FALSE(second->late) << "clock 0 is the round the chunk collects after the assignment";
  EXPECT_EQ(Values(), (std::vector<float>{3, 3, 3})) << "5 - mean(1, 3)";
  EXPECT_EQ(store_.Stats().late_pushes(), 0);
  // Chunk 1 was never assigned; close its round 0 too, then a checkpoint of clock 1 finds both chunks there.
  ASSERT_THAT(Push(Gradient(0, 3, 0, {1, 1, 1}, 1, /*index=*/1)), IsOk());
  ASSERT_THAT(Push(Gradient(1, 2, 0, {1, 1, 1}, 1, /*index=*/1)), IsOk());
  absl::StatusOr<tessera::v1::ShardCheckpoint> cut = store_.Snapshot(1, absl::Now() + absl::Seconds(5));
  ASSERT_THAT(cut, IsOk());
  ASSERT_EQ(cut->chunks_size(), 2);
  for (const auto& c : cut->chunks()) EXPECT_EQ(c.version() - c.assignments(), 1) << c.param() << "/" << c.index();
}

// Module state (BatchNorm statistics): set by assignments only; a SYNC checkpoint takes it as it is, since it has
// no rounds to wait for.
TEST_F(ShardStoreTest, ModuleStateIsAssignedOnlyAndACheckpointTakesItAsItIs) {
  module_state_ = true;
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  TestPush set = Gradient(0, 1, 0, {5, 5, 5});
  set.push.assign = true;
  ASSERT_THAT(Push(set), IsOk());
  EXPECT_THAT(Push(Gradient(1, 1, 0, {1, 1, 1})),
              StatusIs(absl::StatusCode::kInvalidArgument, "'w' is module state, set by assignments only"));
  EXPECT_EQ(Values(), (std::vector<float>{5, 5, 5}));
  absl::StatusOr<tessera::v1::ShardCheckpoint> cut = store_.Snapshot(7, absl::Now() + absl::Seconds(5));
  ASSERT_THAT(cut, IsOk());
  ASSERT_EQ(cut->chunks_size(), 2);
  for (const auto& c : cut->chunks()) {
    if (c.index() != 0) continue;
    std::vector<float> held(3);
    ASSERT_EQ(c.values().size(), held.size() * sizeof(float));
    std::memcpy(held.data(), c.values().data(), c.values().size());
    EXPECT_EQ(held, (std::vector<float>{5, 5, 5}));
  }
}

// A SYNC checkpoint takes module state once the server's chunks have reached the cut's round, not when the cut
// starts: the workers held at that clock wrote it before their gradients of the round (a script's kept values).
TEST_F(ShardStoreTest, ASyncCheckpointTakesModuleStateOnceItsRoundsAreIn) {
  with_state_ = true;
  Assign(tessera::v1::ConsistencySpec::SYNC, 1);
  auto assign_state = [&](uint64_t seq, float v) {
    TestPush set = Gradient(0, seq, 0, {v, v, v});
    set.param = "s";
    set.push.assign = true;
    return Push(set);
  };
  ASSERT_THAT(assign_state(1, 1), IsOk());
  std::optional<absl::StatusOr<tessera::v1::ShardCheckpoint>> cut;
  std::thread cutting([&] { cut = store_.Snapshot(1, absl::Now() + absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(200));  // the cut waits for round 0 of "w"
  ASSERT_THAT(assign_state(2, 2), IsOk());
  ASSERT_THAT(Push(Gradient(0, 3, 0, {1, 1, 1})), IsOk());
  ASSERT_THAT(Push(Gradient(0, 4, 0, {1, 1, 1}, 1, /*index=*/1)), IsOk());
  cutting.join();
  ASSERT_TRUE(cut.has_value());
  ASSERT_THAT(*cut, IsOk());
  ASSERT_EQ((*cut)->chunks_size(), 3);
  for (const auto& c : (*cut)->chunks()) {
    if (c.param() != "s") continue;
    std::vector<float> held(3);
    ASSERT_EQ(c.values().size(), held.size() * sizeof(float));
    std::memcpy(held.data(), c.values().data(), c.values().size());
    EXPECT_EQ(held, (std::vector<float>{2, 2, 2})) << "the state as the round closed, not as the cut started";
  }
}

TEST_F(ShardStoreTest, SyncLatePushIsCountedAndNotMixedIn) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 1);
  ASSERT_THAT(Push(Gradient(0, 1, 0, {1, 1, 1})), IsOk());
  ASSERT_THAT(Push(Gradient(0, 2, 0, {5, 5, 5})), IsOk());  // round 0 again, new seq: late
  EXPECT_EQ(Values(), (std::vector<float>{-1, -1, -1}));
  EXPECT_EQ(store_.Stats().late_pushes(), 1);
  EXPECT_THAT(Push(Gradient(0, 3, 5, {1, 1, 1})),
              StatusIs(absl::StatusCode::kUnavailable, "round 5 is not open"));
}

tessera::v1::DecideRoundsRequest Decided(int64_t round, std::vector<int> workers) {
  tessera::v1::DecideRoundsRequest request;
  auto* r = request.add_rounds();
  r->set_round(round);
  for (int w : workers) r->add_workers(w);
  return request;
}

// Backup workers: both chunks see the three workers' gradients in different orders, and both close round 0
// with exactly the members the scheduler named; the third worker's gradient is counted late, never applied.
TEST_F(ShardStoreTest, BackupWorkersCloseEveryChunkWithTheDecidedMembersOnly) {
  job_.mutable_consistency()->set_backup_workers(1);
  Assign(tessera::v1::ConsistencySpec::SYNC, 3);
  ASSERT_THAT(Push(Gradient(1, 1, 0, {1000, 1000, 1000}, 1, /*index=*/0)), IsOk());  // the late one, first here
  ASSERT_THAT(Push(Gradient(0, 1, 0, {2, 2, 2}, 1, 0)), IsOk());
  ASSERT_THAT(Push(Gradient(2, 1, 0, {4, 4, 4}, 3, 0)), IsOk());
  ASSERT_THAT(Push(Gradient(2, 1, 0, {4, 4, 4}, 3, /*index=*/1)), IsOk());
  ASSERT_THAT(Push(Gradient(0, 1, 0, {2, 2, 2}, 1, 1)), IsOk());
  EXPECT_EQ(Values(0), (std::vector<float>{0, 0, 0})) << "no round closes before its members are named";
  EXPECT_EQ(Values(1), (std::vector<float>{0, 0, 0}));
  ASSERT_THAT(store_.DecideRounds(Decided(0, {0, 2})), IsOk());
  // (1 * 2 + 3 * 4) / 4 = 3.5 on both chunks, although chunk 0 had worker 1's gradient and chunk 1 did not.
  EXPECT_EQ(Values(0), (std::vector<float>{-3.5, -3.5, -3.5}));
  EXPECT_EQ(Values(1), (std::vector<float>{-3.5, -3.5, -3.5}));
  EXPECT_EQ(store_.Stats().late_pushes(), 1);
  // The late worker's gradient of round 0 on chunk 1 arrives after the round closed: late, not applied to
  // round 1 either.
  absl::StatusOr<PushOutcome> late = Push(Gradient(1, 1, 0, {1000, 1000, 1000}, 1, 1));
  ASSERT_THAT(late, IsOk());
  EXPECT_TRUE(late->late);
  EXPECT_EQ(store_.Stats().late_pushes(), 2);
  ASSERT_THAT(Push(Gradient(0, 2, 1, {1, 1, 1}, 1, 1)), IsOk());
  ASSERT_THAT(Push(Gradient(1, 2, 1, {1, 1, 1}, 1, 1)), IsOk());
  ASSERT_THAT(store_.DecideRounds(Decided(1, {0, 1})), IsOk());
  EXPECT_EQ(Values(1), (std::vector<float>{-4.5, -4.5, -4.5})) << "round 1 is the mean of its own members only";
}

// A member's gradient that arrives after the decision closes the round; a non-member's exchange waits for the
// close and gets the round's values (it is not left hanging, and does not hold the round).
TEST_F(ShardStoreTest, BackupWorkersRoundClosesWhenTheLastMemberArrivesAndAnswersTheLateExchange) {
  job_.mutable_consistency()->set_backup_workers(1);
  Assign(tessera::v1::ConsistencySpec::SYNC, 3);
  ASSERT_THAT(store_.DecideRounds(Decided(0, {0, 1})), IsOk());
  auto first = PushPull(Gradient(0, 1, 0, {2, 2, 2}));
  auto late = PushPull(Gradient(2, 1, 0, {1000, 1000, 1000}));
  EXPECT_FALSE(first->has_value());
  EXPECT_FALSE(late->has_value()) << "the late exchange is answered with the round's values";
  auto last = PushPull(Gradient(1, 1, 0, {4, 4, 4}));
  for (const auto& slot : {first, late, last}) {
    ASSERT_TRUE(slot->has_value());
    const absl::StatusOr<ChunkValues>& answer = **slot;
    ASSERT_THAT(answer, IsOk());
    EXPECT_EQ(Floats(*answer), (std::vector<float>{-3, -3, -3}));
  }
  EXPECT_EQ(store_.Stats().late_pushes(), 1);
}

TEST_F(ShardStoreTest, StalenessIsClockMinusTheClockVersionRead) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 2);
  TestPush r = Gradient(0, 1, 4, {1, 1, 1});
  r.push.read_clock_version = 1;
  ASSERT_THAT(Push(r), IsOk());
  EXPECT_EQ(store_.Stats().staleness().max(), 3);
}

TEST_F(ShardStoreTest, StalenessAwareLearningRateDividesTheStepByTheStaleness) {
  job_.mutable_consistency()->set_staleness_aware_lr(true);
  Assign(tessera::v1::ConsistencySpec::ASYNC, 2);
  TestPush stale = Gradient(0, 1, 4, {8, 8, 8});
  stale.push.read_clock_version = 0;  // staleness 4: the step is lr * g / 4
  ASSERT_THAT(Push(stale), IsOk());
  EXPECT_EQ(Values(), (std::vector<float>{-2, -2, -2}));
  ASSERT_THAT(Push(Gradient(1, 1, 0, {1, 1, 1})), IsOk());  // staleness 0: the full step
  EXPECT_EQ(Values(), (std::vector<float>{-3, -3, -3}));
}

// DC-ASGD (consistency.delay_compensation): a gradient computed on values that have moved since is applied as
// g + lambda * g^2 * (w_now - w_read); one computed on the values as they are now, or by a worker that read
// nothing, as sent.
TEST_F(ShardStoreTest, DelayCompensationCorrectsAStaleGradientByTheValuesItsWorkerRead) {
  job_.mutable_consistency()->set_delay_compensation(0.5f);
  Assign(tessera::v1::ConsistencySpec::ASYNC, 2);
  ASSERT_THAT(store_.Pull(ChunkPull{{1, "w", 0}, -1, /*worker_id=*/1}), IsOk());  // worker 1 reads {0, 0, 0}
  ASSERT_THAT(Push(Gradient(0, 1, 0, {1, 2, 3})), IsOk());  // worker 0 read nothing: as sent, w = {-1, -2, -3}
  // Worker 1's gradient {2, 1, -1} on {0, 0, 0}, landing on {-1, -2, -3}:
  // {2 + 0.5*4*(-1), 1 + 0.5*1*(-2), -1 + 0.5*1*(-3)} = {0, 0, -2.5}.
  std::shared_ptr<std::optional<absl::StatusOr<ChunkValues>>> answer = PushPull(Gradient(1, 1, 0, {2, 1, -1}));
  ASSERT_TRUE(answer->has_value());
  ASSERT_THAT(**answer, IsOk());
  EXPECT_EQ(Floats(***answer), (std::vector<float>{-1, -2, -0.5f}));
  // Worker 1 read those values with the answer and nothing moved since: its next gradient goes as sent.
  ASSERT_THAT(Push(Gradient(1, 2, 1, {1, 1, 1})), IsOk());
  EXPECT_EQ(Values(), (std::vector<float>{-2, -3, -1.5f}));
  // One push corrected, by {-2, -1, -1.5} on {2, 1, -1}.
  const tessera::v1::ServerStats stats = store_.Stats();
  EXPECT_EQ(stats.compensated_pushes(), 1);
  EXPECT_DOUBLE_EQ(stats.compensated_grad_sq(), 6);
  EXPECT_DOUBLE_EQ(stats.compensation_sq(), 7.25);
}

TEST(DelayCompensatedTest, IsTheFirstOrderCorrectionOverEveryPiece) {
  const std::vector<float> g = {1, -2, 3, 0.5f}, now = {0, 1, 2, 3}, read = {1, 1, 0, -1};
  FloatPieces pieces(absl::MakeConstSpan(g).subspan(0, 1));
  pieces.Append(absl::MakeConstSpan(g).subspan(1));
  std::vector<float> out(4);
  const Compensation sums = DelayCompensated(pieces, now, read, 0.25f, absl::MakeSpan(out));
  double g_sq = 0, c_sq = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const float c = 0.25f * g[i] * g[i] * (now[i] - read[i]);
    EXPECT_FLOAT_EQ(out[i], g[i] + c) << i;
    g_sq += g[i] * g[i];
    c_sq += c * c;
  }
  EXPECT_DOUBLE_EQ(sums.grad_sq, g_sq);
  EXPECT_NEAR(sums.correction_sq, c_sq, 1e-6);
}

// A new view that drops a lost worker: a sync round it was the last one missing from closes at once, its
// clock no longer holds the chunk's clock_version (and so everyone's staleness) back, and its pushes are refused.
// Its next incarnation starts a new sequence.
TEST_F(ShardStoreTest, AViewWithoutALostWorkerClosesItsRoundAndLeavesItOutOfTheStaleness) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  std::shared_ptr<std::optional<absl::StatusOr<ChunkValues>>> waiting = PushPull(Gradient(0, 1, 0, {2, 2, 2}));
  EXPECT_FALSE(waiting->has_value()) << "the round waits for worker 1";
  tessera::v1::ShardMap view = map_;
  view.set_epoch(2);
  for (int w = 0; w < 2; ++w) {
    auto* slot = view.add_workers();
    slot->set_id(w);
    slot->set_incarnation(1);
    slot->set_active(w == 0);
  }
  ASSERT_THAT(store_.Assign(view, job_, 0), IsOk());
  ASSERT_TRUE(waiting->has_value()) << "worker 1 left: the round closed";
  ASSERT_THAT(**waiting, IsOk());
  EXPECT_EQ((**waiting)->clock_version, 1) << "worker 1's clock 0 no longer counts";
  TestPush lost = Gradient(1, 1, 1, {1, 1, 1});
  lost.push.address.epoch = 2;
  lost.push.incarnation = 1;
  EXPECT_THAT(Push(lost), StatusIs(absl::StatusCode::kFailedPrecondition, "not in the job's cluster view"));

  // Worker 1 back as incarnation 2, in the rounds from clock 1: its seq 1 is new, not a duplicate.
  view.set_epoch(3);
  view.mutable_workers(1)->set_active(true);
  view.mutable_workers(1)->set_incarnation(2);
  view.mutable_workers(1)->set_joined_clock(1);
  ASSERT_THAT(store_.Assign(view, job_, 0), IsOk());
  TestPush back = Gradient(1, 1, 1, {1, 1, 1});
  back.push.address.epoch = 3;
  back.push.incarnation = 2;
  absl::StatusOr<PushOutcome> outcome = Push(back);
  ASSERT_THAT(outcome, IsOk());
  EXPECT_FALSE(outcome->duplicate);
  back.push.incarnation = 1;
  back.push.seq = 2;
  EXPECT_THAT(Push(back), StatusIs(absl::StatusCode::kFailedPrecondition, "held by incarnation 2"));
}

// A checkpoint's chunks restored on another server keep values, versions and optimizer state; the sequence
// table is kept only for a worker process the checkpoint knew (same non-zero incarnation): a new process
// numbers its pushes from 1 again, and they must not be taken for duplicates.
TEST_F(ShardStoreTest, RestoredChunksKeepTheirStateAndForgetSequencesOfUnknownProcesses) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  ASSERT_THAT(Push(Gradient(0, 7, 0, {1, 2, 3})), IsOk());
  absl::StatusOr<tessera::v1::ShardCheckpoint> saved = store_.Snapshot(-1, absl::InfiniteFuture());
  ASSERT_THAT(saved, IsOk());
  ASSERT_EQ(saved->chunks_size(), 2);

  ShardStore restored;
  std::vector<tessera::v1::ShardCheckpoint> files = {*saved};
  ASSERT_THAT(restored.Assign(map_, job_, 0, &files), IsOk());
  absl::StatusOr<ChunkValues> pulled = restored.Pull(ChunkPull{{1, "w", 0}, -1});
  ASSERT_THAT(pulled, IsOk());
  EXPECT_EQ(pulled->version, 1);
  std::vector<float> values(3);
  std::memcpy(values.data(), pulled->bytes->data(), 12);
  EXPECT_EQ(values, (std::vector<float>{-1, -2, -3}));
  TestPush fresh = Gradient(0, 1, 1, {1, 1, 1});
  fresh.push.address.param = fresh.param;
  absl::StatusOr<PushOutcome> outcome = restored.Push(fresh.push, SpanPayload(fresh.values));
  ASSERT_THAT(outcome, IsOk());
  EXPECT_FALSE(outcome->duplicate) << "a new process's seq 1 is not the old process's seq 7";
  EXPECT_EQ(outcome->version, 2);
}

TEST_F(ShardStoreTest, UnknownParameterIsNotFound) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  TestPush r = Gradient(0, 1, 0, {1, 1, 1});
  r.param = "nope";
  EXPECT_THAT(Push(r), StatusIs(absl::StatusCode::kNotFound, "nope"));
}

TEST_F(ShardStoreTest, WrongByteLengthIsInvalidAndChangesNothing) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  EXPECT_THAT(Push(Gradient(0, 1, 0, {1, 1})),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected 12 bytes (3 float32 values), got 8"));
  EXPECT_EQ(Values(), (std::vector<float>{0, 0, 0}));
}

TEST_F(ShardStoreTest, NonFiniteGradientIsInvalidAndChangesNothing) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  EXPECT_THAT(Push(Gradient(0, 1, 0, {1, std::numeric_limits<float>::quiet_NaN(), 1})),
              StatusIs(absl::StatusCode::kInvalidArgument, "index 1"));
  EXPECT_THAT(Push(Gradient(0, 2, 0, {1, 1, std::numeric_limits<float>::infinity()})),
              StatusIs(absl::StatusCode::kInvalidArgument, "index 2"));
  EXPECT_EQ(Values(), (std::vector<float>{0, 0, 0}));
  absl::StatusOr<PushOutcome> retried = Push(Gradient(0, 1, 0, {1, 1, 1}));
  ASSERT_THAT(retried, IsOk());
  EXPECT_FALSE(retried->duplicate) << "a rejected push does not use up its seq";
  EXPECT_EQ(Values(), (std::vector<float>{-1, -1, -1}));
}

TEST_F(ShardStoreTest, StaleEpochIsFailedPreconditionCarryingTheCurrentEpoch) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  map_.set_epoch(3);
  ASSERT_THAT(store_.Assign(map_, job_, 0), IsOk());
  absl::StatusOr<PushOutcome> pushed = Push(Gradient(0, 1, 0, {1, 1, 1}));
  EXPECT_THAT(pushed, StatusIs(absl::StatusCode::kFailedPrecondition, "epoch 1"));
  EXPECT_EQ(GetCurrentEpoch(pushed.status()), std::optional<uint64_t>(3));
}

TEST_F(ShardStoreTest, SyncExchangeAnswersEveryWorkerWhenTheRoundClosesWithOneSharedCopy) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  auto first = PushPull(Gradient(0, 1, 0, {3, 3, 3}, /*batch=*/1));
  EXPECT_FALSE(first->has_value()) << "the round waits for worker 1";
  auto second = PushPull(Gradient(1, 1, 0, {7, 7, 7}, /*batch=*/3));
  ASSERT_TRUE(first->has_value());
  ASSERT_TRUE(second->has_value());
  ASSERT_THAT(**first, IsOk());
  ASSERT_THAT(**second, IsOk());
  EXPECT_EQ(Floats(***first), (std::vector<float>{-6, -6, -6}));
  EXPECT_EQ((**first)->version, 1);
  EXPECT_EQ((**first)->bytes, (**second)->bytes) << "one copy of the closed round serves every exchange";
  EXPECT_EQ(Values(), (std::vector<float>{-6, -6, -6}));
}

// Clipping's norm round (PushRequest.norm_only): it answers every worker, once all are in, with the squared norm
// of the batch-weighted mean and changes nothing; a retry gets the same norm; the update round of the same clock
// then runs as ever; a worker that leaves closes it; an ASYNC job has none.
TEST_F(ShardStoreTest, ANormRoundAnswersTheSquaredNormOfTheMeanAndChangesNothing) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  auto norm = [&](int worker, uint64_t seq, int64_t clock, std::vector<float> g, int batch) {
    TestPush r = Gradient(worker, seq, clock, std::move(g), batch);
    r.push.norm_only = true;
    return PushPull(r);
  };
  auto first = norm(0, 1, 0, {3, 0, 4}, 1);
  EXPECT_FALSE(first->has_value()) << "the norm round waits for worker 1";
  auto second = norm(1, 1, 0, {3, 8, 4}, 3);
  ASSERT_TRUE(first->has_value() && second->has_value());
  ASSERT_THAT(**first, IsOk());
  ASSERT_THAT(**second, IsOk());
  // The mean: (1 * {3, 0, 4} + 3 * {3, 8, 4}) / 4 = {3, 6, 4}: 9 + 36 + 16.
  EXPECT_DOUBLE_EQ((**first)->round_sq_norm, 61.0);
  EXPECT_DOUBLE_EQ((**second)->round_sq_norm, 61.0);
  EXPECT_EQ((**first)->bytes, nullptr) << "no values with a norm";
  EXPECT_EQ(Values(), (std::vector<float>{0, 0, 0})) << "a norm round changes nothing";
  auto retried = norm(0, 1, 0, {3, 0, 4}, 1);
  ASSERT_TRUE(retried->has_value());
  ASSERT_THAT(**retried, IsOk());
  EXPECT_DOUBLE_EQ((**retried)->round_sq_norm, 61.0);
  // The update round of clock 0 takes its pushes (sequence numbers after the norm's) as ever.
  auto update = PushPull(Gradient(0, 2, 0, {1, 1, 1}));
  ASSERT_THAT(Push(Gradient(1, 2, 0, {1, 1, 1})), IsOk());
  ASSERT_TRUE(update->has_value());
  EXPECT_EQ(Values(), (std::vector<float>{-1, -1, -1}));
  EXPECT_THAT(**norm(0, 3, 0, {1, 1, 1}, 1), StatusIs(absl::StatusCode::kAborted, "is over"));
  EXPECT_THAT(**norm(0, 3, 2, {1, 1, 1}, 1), StatusIs(absl::StatusCode::kUnavailable, "not open yet"));

  // Worker 1 leaves while the norm round of clock 1 waits for it: the round closes with worker 0's alone.
  auto waiting = norm(0, 4, 1, {0, 2, 0}, 1);
  EXPECT_FALSE(waiting->has_value());
  tessera::v1::ShardMap view = map_;
  view.set_epoch(2);
  for (int w = 0; w < 2; ++w) {
    auto* slot = view.add_workers();
    slot->set_id(w);
    slot->set_incarnation(0);
    slot->set_active(w == 0);
  }
  ASSERT_THAT(store_.Assign(view, job_, 0), IsOk());
  ASSERT_TRUE(waiting->has_value()) << "worker 1 left: the norm round closed";
  ASSERT_THAT(**waiting, IsOk());
  EXPECT_DOUBLE_EQ((**waiting)->round_sq_norm, 4.0);
}

TEST_F(ShardStoreTest, AnAsyncJobHasNoNormRounds) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  TestPush r = Gradient(0, 1, 0, {1, 1, 1});
  r.push.norm_only = true;
  EXPECT_THAT(**PushPull(r), StatusIs(absl::StatusCode::kFailedPrecondition, "SYNC jobs that clip"));
  EXPECT_EQ(Values(), (std::vector<float>{0, 0, 0}));
}

TEST_F(ShardStoreTest, PlainPushClosingTheRoundAnswersWaitingExchanges) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  auto waiting = PushPull(Gradient(0, 1, 0, {2, 2, 2}));
  ASSERT_THAT(Push(Gradient(1, 1, 0, {4, 4, 4})), IsOk());
  ASSERT_TRUE(waiting->has_value());
  ASSERT_THAT(**waiting, IsOk());
  EXPECT_EQ(Floats(***waiting), (std::vector<float>{-3, -3, -3}));
}

TEST_F(ShardStoreTest, RetriedExchangeOfAClosedRoundGetsTheValuesWithoutApplyingTwice) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 1);
  auto original = PushPull(Gradient(0, 1, 0, {1, 1, 1}));
  ASSERT_TRUE(original->has_value());
  auto retried = PushPull(Gradient(0, 1, 0, {1, 1, 1}));
  ASSERT_TRUE(retried->has_value());
  ASSERT_THAT(**retried, IsOk());
  EXPECT_EQ(Floats(***retried), (std::vector<float>{-1, -1, -1}));
  EXPECT_EQ(store_.Stats().duplicate_pushes(), 1);
}

TEST_F(ShardStoreTest, AsyncExchangeAnswersAtOnceWithTheValuesAfterThePush) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 2);
  auto answer = PushPull(Gradient(0, 1, 0, {1, 2, 3}));
  ASSERT_TRUE(answer->has_value());
  ASSERT_THAT(**answer, IsOk());
  EXPECT_EQ(Floats(***answer), (std::vector<float>{-1, -2, -3}));
}

TEST_F(ShardStoreTest, ExchangeErrorsCompleteTheWaiterWithTheStatus) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  auto bad = PushPull(Gradient(0, 1, 0, {1, std::numeric_limits<float>::infinity(), 1}));
  ASSERT_TRUE(bad->has_value());
  EXPECT_THAT(**bad, StatusIs(absl::StatusCode::kInvalidArgument, "index 1"));
}

TEST_F(ShardStoreTest, CancelWaitersReleasesAnOpenRound) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  auto waiting = PushPull(Gradient(0, 1, 0, {1, 1, 1}));
  ASSERT_FALSE(waiting->has_value());
  store_.CancelWaiters(absl::UnavailableError("shutting down"));
  ASSERT_TRUE(waiting->has_value());
  EXPECT_THAT(**waiting, StatusIs(absl::StatusCode::kUnavailable, "shutting down"));
}

TEST_F(ShardStoreTest, PullOfTheVersionHeldCarriesNoBytesAndAPullAfterAPushAlwaysDoes) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  absl::StatusOr<ChunkValues> first = store_.Pull(ChunkPull{{1, "w", 0}, -1});
  ASSERT_THAT(first, IsOk());
  ASSERT_NE(first->bytes, nullptr);
  absl::StatusOr<ChunkValues> unchanged = store_.Pull(ChunkPull{{1, "w", 0}, first->version});
  ASSERT_THAT(unchanged, IsOk());
  EXPECT_EQ(unchanged->bytes, nullptr);
  ASSERT_THAT(Push(Gradient(0, 1, 0, {1, 1, 1})), IsOk());
  absl::StatusOr<ChunkValues> changed = store_.Pull(ChunkPull{{1, "w", 0}, first->version});
  ASSERT_THAT(changed, IsOk());
  ASSERT_NE(changed->bytes, nullptr);
  EXPECT_EQ(Floats(*changed), (std::vector<float>{-1, -1, -1}));
}

TEST_F(ShardStoreTest, ExchangeWaiterRunsItsCallbackExactlyOnce) {
  int runs = 0;
  ExchangeWaiter waiter([&runs](absl::StatusOr<ChunkValues>) { ++runs; });
  EXPECT_TRUE(waiter.Complete(ChunkValues{}));
  EXPECT_FALSE(waiter.Complete(absl::CancelledError("late")));
  EXPECT_TRUE(waiter.completed());
  EXPECT_EQ(runs, 1);
}

TEST_F(ShardStoreTest, AnAssignmentOutsideTheJobsLimitsIsInvalidAndAllocatesNothing) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  const std::vector<float> before = Values();
  // A chunk longer than the job's chunk_bytes (here 1 GiB of floats).
  tessera::v1::ShardMap huge = map_;
  huge.set_epoch(2);
  huge.mutable_params(0)->set_shape(0, int64_t{1} << 28);
  huge.mutable_chunks(0)->set_length(int64_t{1} << 28);
  EXPECT_THAT(store_.Assign(huge, job_, 0), StatusIs(absl::StatusCode::kInvalidArgument, "chunks of at most"));
  // A chunk beyond its parameter's end.
  tessera::v1::ShardMap outside = map_;
  outside.set_epoch(2);
  outside.mutable_chunks(1)->set_offset(5);
  EXPECT_THAT(store_.Assign(outside, job_, 0), StatusIs(absl::StatusCode::kInvalidArgument, "not within"));
  // An epoch no job reaches, after which every real view would be refused.
  tessera::v1::ShardMap last = map_;
  last.set_epoch(std::numeric_limits<uint64_t>::max());
  EXPECT_THAT(store_.Assign(last, job_, 0), StatusIs(absl::StatusCode::kInvalidArgument, "epoch"));
  // A job that does not validate (NaN learning rate, an unknown mode).
  tessera::v1::JobSpec bad = job_;
  bad.mutable_optimizer()->set_learning_rate(std::nanf(""));
  EXPECT_THAT(store_.Assign(map_, bad, 0), StatusIs(absl::StatusCode::kInvalidArgument, "learning_rate"));
  bad = job_;
  bad.mutable_consistency()->set_mode(static_cast<tessera::v1::ConsistencySpec::Mode>(42));
  EXPECT_THAT(store_.Assign(map_, bad, 0), StatusIs(absl::StatusCode::kInvalidArgument, "42"));
  EXPECT_EQ(store_.epoch(), 1u);
  EXPECT_EQ(Values(), before);
  tessera::v1::ShardMap next = map_;
  next.set_epoch(2);
  EXPECT_THAT(store_.Assign(next, job_, 0), IsOk());
}

TEST_F(ShardStoreTest, APushWithoutTheWorkersKeyIsUnauthenticatedOnceTheViewHasItsDigest) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 2);
  tessera::v1::ShardMap view = map_;
  view.set_epoch(2);
  for (int w = 0; w < 2; ++w) {
    auto* slot = view.add_workers();
    slot->set_id(w);
    slot->set_incarnation(1);
    slot->set_active(true);
    slot->set_key_digest(KeyDigest(absl::StrCat("key-of-", w)));
  }
  ASSERT_THAT(store_.Assign(view, job_, 0), IsOk());
  TestPush push = Gradient(1, std::numeric_limits<uint64_t>::max(), 0, {1, 1, 1});
  push.push.address.epoch = 2;
  push.push.incarnation = 1;
  push.push.member_key = "key-of-0";  // worker 0's key, in worker 1's name
  EXPECT_THAT(Push(push), StatusIs(absl::StatusCode::kUnauthenticated, "wrong member key"));
  push.push.member_key = "";
  EXPECT_THAT(Push(push), StatusIs(absl::StatusCode::kUnauthenticated, "no member key"));
  push.push.member_key = "key-of-1";
  push.push.seq = 1;
  absl::StatusOr<PushOutcome> own = Push(push);
  ASSERT_THAT(own, IsOk());
  EXPECT_FALSE(own->duplicate);
}

TEST_F(ShardStoreTest, RoundDecisionsNamingWorkersOutsideTheJobAreInvalid) {
  job_.mutable_consistency()->set_backup_workers(1);
  Assign(tessera::v1::ConsistencySpec::SYNC, 3);
  tessera::v1::DecideRoundsRequest request;
  auto* round = request.add_rounds();
  round->set_round(0);
  round->add_workers(0);
  round->add_workers(1 << 30);
  EXPECT_THAT(store_.DecideRounds(request), StatusIs(absl::StatusCode::kInvalidArgument, "names worker"));
  round->set_workers(1, 1);
  round->set_round(-5);
  EXPECT_THAT(store_.DecideRounds(request), StatusIs(absl::StatusCode::kInvalidArgument, "not a round"));
  round->set_round(0);
  EXPECT_THAT(store_.DecideRounds(request), IsOk());
}

TEST_F(ShardStoreTest, AnUpdateThatWouldOverflowTheValuesIsRefusedAndChangesNothing) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  const std::vector<float> before = Values();
  // Finite, but the learning rate of 1 takes the values past the largest float.
  const float huge = -3e38f;
  ASSERT_THAT(Push(Gradient(0, 1, 0, {huge, huge, huge})), IsOk());  // values near 3e38 now
  const std::vector<float> near_max = Values();
  EXPECT_THAT(Push(Gradient(0, 2, 1, {huge, huge, huge})), StatusIs(absl::StatusCode::kInvalidArgument, "non-finite"));
  EXPECT_EQ(Values(), near_max);
  // The refused push did not use up its sequence number.
  EXPECT_THAT(Push(Gradient(0, 2, 1, {1, 1, 1})), IsOk());
  EXPECT_NE(before, near_max);
}

TEST_F(ShardStoreTest, ASyncRoundWhoseMeanWouldOverflowClosesWithoutAnUpdate) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  const float huge = -3e38f;
  ASSERT_THAT(Push(Gradient(0, 1, 0, {huge, huge, huge})), IsOk());
  ASSERT_THAT(Push(Gradient(1, 1, 0, {huge, huge, huge})), IsOk());  // round 0: values near 3e38
  const std::vector<float> after_first = Values();
  ASSERT_THAT(Push(Gradient(0, 2, 1, {huge, huge, huge})), IsOk());
  ASSERT_THAT(Push(Gradient(1, 2, 1, {huge, huge, huge})), IsOk());  // round 1 closes, its update left out
  EXPECT_EQ(Values(), after_first);
  // Round 2 is open: the workers go on.
  EXPECT_THAT(Push(Gradient(0, 3, 2, {1, 1, 1})), IsOk());
}

// A worker's gradient scaler found inf or NaN and it skips its step: the round applies nothing on the chunk, for
// every worker, its exchanges' answers say so, and the next round applies as usual.
TEST_F(ShardStoreTest, ASyncRoundAWorkerSkipsAppliesNothingAndItsAnswersSaySkipped) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  TestPush skip = Gradient(1, 1, 0, {0, 0, 0});
  skip.push.skip = true;
  auto first = PushPull(Gradient(0, 1, 0, {5, 5, 5}));
  auto second = PushPull(skip);
  ASSERT_TRUE(first->has_value() && second->has_value());
  for (const auto& answer : {first, second}) {
    ASSERT_THAT(**answer, IsOk());
    EXPECT_TRUE((**answer)->skipped);
    EXPECT_EQ(Floats(***answer), (std::vector<float>{0, 0, 0}));
  }
  auto next = PushPull(Gradient(0, 2, 1, {1, 1, 1}));
  ASSERT_THAT(Push(Gradient(1, 2, 1, {3, 3, 3})), IsOk()) << "the round after a skipped one is open";
  ASSERT_TRUE(next->has_value());
  EXPECT_FALSE((**next)->skipped);
  EXPECT_EQ(Values(), (std::vector<float>{-2, -2, -2}));
}

// The learning rate a worker's schedule sets (PushRequest.lr_factor) scales the step: in SYNC the round takes the
// smallest of its workers', in ASYNC each push its own.
TEST_F(ShardStoreTest, ALearningRateFactorScalesTheStepInEveryMode) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  TestPush a = Gradient(0, 1, 0, {4, 4, 4});
  TestPush b = Gradient(1, 1, 0, {4, 4, 4});
  a.push.lr_factor = 0.5f;
  b.push.lr_factor = 0.25f;
  ASSERT_THAT(Push(a), IsOk());
  ASSERT_THAT(Push(b), IsOk());
  EXPECT_EQ(Values(), (std::vector<float>{-1, -1, -1}));
}

TEST_F(ShardStoreTest, AnAsyncPushWithALearningRateFactorOrASkipScalesOrSkipsOnlyItself) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 2);
  TestPush half = Gradient(0, 1, 0, {4, 4, 4});
  half.push.lr_factor = 0.5f;
  ASSERT_THAT(Push(half), IsOk());
  EXPECT_EQ(Values(), (std::vector<float>{-2, -2, -2}));
  TestPush skip = Gradient(1, 1, 0, {9, 9, 9});
  skip.push.skip = true;
  ASSERT_THAT(Push(skip), IsOk());
  EXPECT_EQ(Values(), (std::vector<float>{-2, -2, -2}));
}

}  // namespace
}  // namespace tessera
