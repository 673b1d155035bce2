// Embedding tables on a server (server/tables/sparse_table.h, server/row_requests.cc): hash placement, rows
// created on first touch, duplicate ids, exactly-once pushes, admission, expiry, the memory cap, checkpoints,
// replication's updates, and requests that must change nothing.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/model/job_spec.h"
#include "common/model/shard_map.h"
#include "common/model/wire_limits.h"
#include "gtest/gtest.h"
#include "server/shard_store.h"
#include "server/tables/sparse_table.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

constexpr int kDim = 4;
constexpr int kSlots = 8;

tessera::v1::ParameterSpec Table(const std::string& name = "emb") {
  tessera::v1::ParameterSpec p;
  p.set_name(name);
  p.set_dtype(tessera::v1::DT_FLOAT32);
  p.add_shape(kDim);
  p.mutable_init()->set_kind(tessera::v1::InitSpec::UNIFORM);
  p.mutable_init()->set_scale(0.5f);
  p.mutable_init()->set_seed(7);
  p.mutable_embedding()->set_slots(kSlots);
  p.mutable_embedding()->mutable_optimizer()->set_learning_rate(1.0f);
  return p;
}

TEST(EmbeddingPlacementTest, SlotsGoRoundTheServersAndIdsHashToSlots) {
  tessera::v1::ShardMap map;
  for (int s = 0; s < 3; ++s) map.add_servers()->set_id(s);
  ASSERT_THAT(PlaceParameters({Table()}, 65536, map), IsOk());
  ASSERT_EQ(map.chunks_size(), kSlots);
  for (int s = 0; s < kSlots; ++s) {
    EXPECT_EQ(map.chunks(s).index(), s);
    EXPECT_EQ(map.chunks(s).server_id(), s % 3);
    EXPECT_EQ(map.chunks(s).length(), kDim);
  }
  // Ids spread over the slots, consecutive ones included.
  std::vector<int> per_slot(kSlots, 0);
  for (uint64_t id = 0; id < 8000; ++id) ++per_slot[EmbeddingSlot(id, kSlots)];
  for (int n : per_slot) EXPECT_NEAR(n, 1000, 150);
  tessera::v1::ParameterSpec bad = Table("bad");
  bad.add_shape(2);  // [dim, 2]: not a row shape
  EXPECT_THAT(PlaceParameters({bad}, 65536, map), StatusIs(absl::StatusCode::kInvalidArgument, "[dim]"));
}

// One table "emb" (8 slots of rows of 4, SGD lr 1) on one server; `workers` workers.
class SparseTableTest : public ::testing::Test {
 protected:
  void Assign(tessera::v1::ConsistencySpec::Mode mode, int workers, tessera::v1::ParameterSpec table = Table(),
              ShardStore* store = nullptr, const std::vector<tessera::v1::ShardCheckpoint>* restore = nullptr) {
    job_ = tessera::v1::JobSpec();
    job_.mutable_model()->mutable_softmax_regression();
    job_.mutable_consistency()->set_mode(mode);
    job_.mutable_cluster()->set_num_workers(workers);
    job_.mutable_stop()->set_max_steps(100);
    job_.set_batch_size(8);
    if (delta_checkpoints_) job_.mutable_checkpoint()->set_full_every(4);
    ApplyJobDefaults(job_);
    map_ = tessera::v1::ShardMap();
    auto* server = map_.add_servers();
    server->set_id(0);
    server->set_address("127.0.0.1:1");
    ASSERT_THAT(PlaceParameters({table}, job_.chunk_bytes(), map_), IsOk());
    ASSERT_THAT((store ? store : &store_)->Assign(map_, job_, 0, restore), IsOk());
  }

  absl::StatusOr<std::vector<float>> Pull(std::vector<uint64_t> ids, ShardStore* store = nullptr) {
    tessera::v1::RowPullRequest r;
    r.set_epoch(map_.epoch());
    r.set_table("emb");
    for (uint64_t id : ids) r.add_ids(id);
    absl::StatusOr<tessera::v1::RowPullResponse> pulled = (store ? store : &store_)->PullRows(r);
    if (!pulled.ok()) return pulled.status();
    std::vector<float> out(pulled->values().size() / sizeof(float));
    std::memcpy(out.data(), pulled->values().data(), pulled->values().size());
    return out;
  }

  tessera::v1::RowPushRequest PushRequest(const std::vector<uint64_t>& ids, const std::vector<float>& grads,
                                          uint64_t seq, int64_t clock, int worker, int batch) {
    tessera::v1::RowPushRequest r;
    r.set_epoch(map_.epoch());
    r.set_worker_id(worker);
    r.set_seq(seq);
    r.set_clock(clock);
    r.set_batch_size(batch);
    r.set_table("emb");
    for (uint64_t id : ids) r.add_ids(id);
    r.set_grads(std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * sizeof(float)));
    return r;
  }

  absl::StatusOr<tessera::v1::RowPushResponse> Push(std::vector<uint64_t> ids, std::vector<float> grads, uint64_t seq,
                                                    int64_t clock = 0, int worker = 0, int batch = 8,
                                                    ShardStore* store = nullptr) {
    const tessera::v1::RowPushRequest r = PushRequest(ids, grads, seq, clock, worker, batch);
    absl::Notification answered;
    absl::StatusOr<tessera::v1::RowPushResponse> result;
    (store ? store : &store_)->PushRows(r, "", [&](absl::StatusOr<tessera::v1::RowPushResponse> response) {
      result = std::move(response);
      answered.Notify();
    });
    answered.WaitForNotification();
    return result;
  }

  static std::vector<float> Init(uint64_t id, const tessera::v1::ParameterSpec& table = Table()) {
    std::vector<float> row(kDim);
    FillRowInit(table.init(), table.name(), id, absl::MakeSpan(row));
    return row;
  }

  tessera::v1::TableStats Stats(ShardStore* store = nullptr) {
    tessera::v1::ServerStats stats = (store ? store : &store_)->Stats();
    return stats.tables_size() > 0 ? stats.tables(0) : tessera::v1::TableStats();
  }

  bool delta_checkpoints_ = false;  // the job writes delta checkpoints (checkpoint.full_every > 1)
  tessera::v1::JobSpec job_;
  tessera::v1::ShardMap map_;
  ShardStore store_;
};

TEST_F(SparseTableTest, RowsReadTheirInitialValuesUntilAGradientCreatesThem) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  absl::StatusOr<std::vector<float>> first = Pull({42, 7});
  ASSERT_THAT(first, IsOk());
  std::vector<float> expected = Init(42);
  std::vector<float> seven = Init(7);
  expected.insert(expected.end(), seven.begin(), seven.end());
  EXPECT_EQ(*first, expected);
  EXPECT_NE(Init(42), Init(43));
  EXPECT_EQ(Stats().rows(), 0) << "reading creates no row";
  ASSERT_THAT(Push({42}, {1, 2, 3, 4}, 1), IsOk());
  absl::StatusOr<std::vector<float>> after = Pull({42});
  ASSERT_THAT(after, IsOk());
  for (int j = 0; j < kDim; ++j) EXPECT_FLOAT_EQ((*after)[j], Init(42)[j] - (j + 1)) << j;
  EXPECT_EQ(Stats().rows(), 1);
  EXPECT_EQ(Stats().rows_created(), 1);
}

TEST_F(SparseTableTest, DuplicateIdsAreSummedTheSameInAnyOrder) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  ShardStore other;
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1, Table(), &other);
  ASSERT_THAT(Push({5, 9, 5}, {1e8f, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0}, 1), IsOk());
  ASSERT_THAT(Push({5, 5, 9}, {1, 0, 0, 0, 1e8f, 0, 0, 0, 1, 1, 1, 1}, 1, 0, 0, 8, &other), IsOk());
  EXPECT_EQ(*Pull({5, 9}), *Pull({5, 9}, &other));
}

TEST_F(SparseTableTest, ARepeatedSeqIsAppliedOnce) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  ASSERT_THAT(Push({3}, {1, 1, 1, 1}, 1), IsOk());
  absl::StatusOr<tessera::v1::RowPushResponse> again = Push({3}, {1, 1, 1, 1}, 1);
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(again->duplicate());
  EXPECT_FLOAT_EQ((*Pull({3}))[0], Init(3)[0] - 1);
}

// SYNC: a round of rows closes at its last worker's push; its batch-weighted mean is applied once, and every push
// of it is answered then. A push of a round that closed is late: counted, not applied.
TEST_F(SparseTableTest, SyncAppliesTheRoundsWeightedMeanOnceWhenItsLastWorkerPushed) {
  Assign(tessera::v1::ConsistencySpec::SYNC, 2);
  absl::Notification first;
  absl::StatusOr<tessera::v1::RowPushResponse> first_answer;
  store_.PushRows(PushRequest({3}, {2, 2, 2, 2}, 1, 0, /*worker=*/0, /*batch=*/1), "",
                  [&](absl::StatusOr<tessera::v1::RowPushResponse> answer) {
                    first_answer = std::move(answer);
                    first.Notify();
                  });
  EXPECT_FALSE(first.HasBeenNotified()) << "worker 0's push waits for the round";
  EXPECT_FLOAT_EQ((*Pull({3}))[0], Init(3)[0]) << "nothing applied before the round closes";
  // Worker 1 touches row 3 and row 5, which worker 0 did not: its mean over the round counts worker 0's zero.
  absl::StatusOr<tessera::v1::RowPushResponse> second = Push({3, 5}, {4, 4, 4, 4, 8, 8, 8, 8}, 1, 0, 1, 3);
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->rows_updated(), 2);
  ASSERT_TRUE(first.HasBeenNotified());
  ASSERT_THAT(first_answer, IsOk());
  EXPECT_EQ(first_answer->rows_updated(), 1);
  EXPECT_FLOAT_EQ((*Pull({3}))[0], Init(3)[0] - (2 * 1 + 4 * 3) / 4.0f) << "the weighted mean, applied once";
  EXPECT_FLOAT_EQ((*Pull({5}))[0], Init(5)[0] - 8 * 3 / 4.0f);
  // A retry of worker 0's push is a duplicate; a push for the closed round from a new seq is late.
  absl::StatusOr<tessera::v1::RowPushResponse> again = Push({3}, {2, 2, 2, 2}, 1, 0, 0, 1);
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(again->duplicate());
  absl::StatusOr<tessera::v1::RowPushResponse> late = Push({3}, {9, 9, 9, 9}, 2, 0, 0, 1);
  ASSERT_THAT(late, IsOk());
  EXPECT_TRUE(late->late());
  EXPECT_FLOAT_EQ((*Pull({3}))[0], Init(3)[0] - 3.5f) << "late rows are never applied";
  EXPECT_EQ(store_.Stats().late_pushes(), 1);
  // A push of a round ahead of the one collected waits for it: UNAVAILABLE, retried by the client.
  absl::Notification ahead_done;
  store_.PushRows(PushRequest({3}, {1, 1, 1, 1}, 3, 1, 0, 1), "", [&](auto) { ahead_done.Notify(); });
  EXPECT_THAT(Push({3}, {1, 1, 1, 1}, 2, 2, 1, 1), StatusIs(absl::StatusCode::kUnavailable, "not open yet"));
  // Worker 1's push of round 1 closes it.
  ASSERT_THAT(Push({7}, {1, 1, 1, 1}, 3, 1, 1, 1), IsOk());
  EXPECT_TRUE(ahead_done.HasBeenNotified());
}

TEST_F(SparseTableTest, IdsAreAdmittedAtTheirKthGradient) {
  tessera::v1::ParameterSpec table = Table();
  table.mutable_embedding()->set_admit_after(3);
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1, table);
  for (uint64_t seq = 1; seq <= 2; ++seq) {
    absl::StatusOr<tessera::v1::RowPushResponse> pushed = Push({11}, {1, 1, 1, 1}, seq);
    ASSERT_THAT(pushed, IsOk());
    EXPECT_EQ(pushed->rows_refused(), 1);
    EXPECT_EQ(*Pull({11}), std::vector<float>(kDim, 0.0f)) << "not admitted: zeros";
  }
  EXPECT_EQ(Stats().pending_ids(), 1);
  absl::StatusOr<tessera::v1::RowPushResponse> third = Push({11}, {1, 1, 1, 1}, 3);
  ASSERT_THAT(third, IsOk());
  EXPECT_EQ(third->rows_updated(), 1);
  EXPECT_FLOAT_EQ((*Pull({11}))[0], Init(11)[0] - 1) << "created at the third, which is applied";
  EXPECT_EQ(Stats().admission_refusals(), 2);
  EXPECT_EQ(Stats().pending_ids(), 0);
}

TEST_F(SparseTableTest, RowsNoGradientReachedExpire) {
  tessera::v1::ParameterSpec table = Table();
  table.mutable_embedding()->set_expire_after_steps(4);
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1, table);
  // Row 1 is not updated after clock 0, row 2 at every clock; expiry is per row, whatever their slots.
  ASSERT_THAT(Push({1, 2}, std::vector<float>(2 * kDim, 1.0f), 1, /*clock=*/0), IsOk());
  for (int64_t clock = 1; clock <= 10; ++clock) {
    ASSERT_THAT(Push({2}, std::vector<float>(kDim, 0.0f), 1 + clock, clock), IsOk());
  }
  // Row 1 expired: as its slot's clock passed, or at the latest before this gradient reached it.
  ASSERT_THAT(Push({1}, std::vector<float>(kDim, 0.0f), 100, 20), IsOk());
  EXPECT_GE(Stats().rows_expired(), 1);
  EXPECT_FLOAT_EQ((*Pull({1}))[0], Init(1)[0]) << "an expired row starts again from its initial values";
  EXPECT_FLOAT_EQ((*Pull({2}))[0], Init(2)[0] - 1) << "a row kept up to date stays";
}

TEST_F(SparseTableTest, PushesBeyondTheMemoryCapAreRefusedChangingNothing) {
  tessera::v1::ParameterSpec table = Table();
  auto spec = RowTableFromDeclaration(table, /*delta_checkpoints=*/false);
  ASSERT_THAT(spec, IsOk());
  ShardStore capped(64 << 20, nullptr, /*row_memory_cap=*/10 * (*spec)->RowBytes());
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1, table, &capped);
  std::vector<uint64_t> many(20);
  for (uint64_t i = 0; i < 20; ++i) many[i] = 1000 + i;
  EXPECT_THAT(Push(many, std::vector<float>(20 * kDim, 1.0f), 1, 0, 0, 8, &capped),
              StatusIs(absl::StatusCode::kResourceExhausted, "row memory"));
  EXPECT_EQ(Stats(&capped).rows(), 0);
  EXPECT_EQ(*Pull({1000}, &capped), Init(1000));
  many.resize(10);
  EXPECT_THAT(Push(many, std::vector<float>(10 * kDim, 1.0f), 2, 0, 0, 8, &capped), IsOk());
  EXPECT_EQ(Stats(&capped).rows(), 10);
  EXPECT_THAT(Push({5000}, std::vector<float>(kDim, 1.0f), 3, 0, 0, 8, &capped),
              StatusIs(absl::StatusCode::kResourceExhausted, "row memory"));
  EXPECT_THAT(Push({1000}, std::vector<float>(kDim, 1.0f), 4, 0, 0, 8, &capped), IsOk())
      << "rows held take gradients at the cap";
}

// A table with evict_when_full keeps to the cap by evicting the least recently updated rows of the slots a push
// creates rows in; an evicted row reads its initial values again.
TEST_F(SparseTableTest, ATableThatEvictsKeepsToTheCapDroppingTheLeastRecentlyUpdatedRows) {
  tessera::v1::ParameterSpec table = Table();
  table.mutable_embedding()->set_slots(1);  // one slot: every row competes
  table.mutable_embedding()->set_evict_when_full(true);
  auto spec = RowTableFromDeclaration(table, /*delta_checkpoints=*/false);
  ASSERT_THAT(spec, IsOk());
  ShardStore capped(64 << 20, nullptr, /*row_memory_cap=*/10 * (*spec)->RowBytes());
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1, table, &capped);
  std::vector<uint64_t> old_ids, new_ids;
  for (uint64_t i = 0; i < 10; ++i) old_ids.push_back(100 + i);
  for (uint64_t i = 0; i < 4; ++i) new_ids.push_back(500 + i);
  ASSERT_THAT(Push(old_ids, std::vector<float>(10 * kDim, 1.0f), 1, /*clock=*/0, 0, 8, &capped), IsOk());
  // Rows 108 and 109 are updated again at clock 1: the least recently updated are 100 .. 107.
  ASSERT_THAT(Push({108, 109}, std::vector<float>(2 * kDim, 1.0f), 2, /*clock=*/1, 0, 8, &capped), IsOk());
  ASSERT_THAT(Push(new_ids, std::vector<float>(4 * kDim, 1.0f), 3, /*clock=*/2, 0, 8, &capped), IsOk());
  EXPECT_EQ(Stats(&capped).rows(), 10);
  EXPECT_EQ(Stats(&capped).rows_evicted(), 4);
  absl::StatusOr<std::vector<float>> kept = Pull({108, 109, 500, 503}, &capped);
  ASSERT_THAT(kept, IsOk());
  EXPECT_FLOAT_EQ((*kept)[0], Init(108)[0] - 2) << "updated at clock 1: kept";
  EXPECT_FLOAT_EQ((*kept)[2 * kDim], Init(500)[0] - 1);
  int evicted = 0;
  for (uint64_t id : old_ids) evicted += (*Pull({id}, &capped))[0] == Init(id)[0];
  EXPECT_EQ(evicted, 4) << "four of the rows last updated at clock 0 read their initial values again";
}

TEST_F(SparseTableTest, HostileRequestsAreRefusedWithNothingChanged) {
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1);
  EXPECT_THAT(Push({1}, {1, 2, 3}, 1), StatusIs(absl::StatusCode::kInvalidArgument, "")) << "a short row";
  EXPECT_THAT(Push({1, 2}, {1, 1, 1, 1, 1, std::nanf(""), 1, 1}, 2), StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(Push({1}, {1, 1, 1, 1}, 0), StatusIs(absl::StatusCode::kInvalidArgument, "")) << "seq 0";
  EXPECT_THAT(Push({1}, {1, 1, 1, 1}, 3, -1), StatusIs(absl::StatusCode::kInvalidArgument, "")) << "clock -1";
  EXPECT_THAT(Push({1}, {1, 1, 1, 1}, 4, 0, /*worker=*/5), StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(Push({1}, {1, 1, 1, 1}, 5, 0, 0, /*batch=*/0), StatusIs(absl::StatusCode::kInvalidArgument, ""));
  std::vector<uint64_t> huge(10'000'000);
  for (size_t i = 0; i < huge.size(); ++i) huge[i] = i;
  EXPECT_THAT(Pull(huge), StatusIs(absl::StatusCode::kInvalidArgument, "at most"));
  EXPECT_THAT(Push(huge, std::vector<float>(huge.size() * kDim, 0.0f), 6),
              StatusIs(absl::StatusCode::kInvalidArgument, ""));
  tessera::v1::RowPullRequest unknown;
  unknown.set_epoch(map_.epoch());
  unknown.set_table("nope");
  unknown.add_ids(1);
  EXPECT_THAT(store_.PullRows(unknown), StatusIs(absl::StatusCode::kNotFound, "no embedding table"));
  tessera::v1::RowPullRequest stale = unknown;
  stale.set_table("emb");
  stale.set_epoch(map_.epoch() - 1);
  EXPECT_THAT(store_.PullRows(stale), StatusIs(absl::StatusCode::kFailedPrecondition, "stale"));
  EXPECT_EQ(Stats().rows(), 0);
  std::vector<float> untouched = Init(1), two = Init(2);
  untouched.insert(untouched.end(), two.begin(), two.end());
  EXPECT_EQ(*Pull({1, 2}), untouched);
}

// A checkpoint's slots restored on another server hold the same rows, optimizer state and step counts: the next
// update gives the same values on both.
TEST_F(SparseTableTest, CheckpointRoundTripKeepsRowsStateAndSteps) {
  tessera::v1::ParameterSpec table = Table();
  table.mutable_embedding()->mutable_optimizer()->set_kind(tessera::v1::RowOptimizerSpec::LAZY_ADAM);
  table.mutable_embedding()->mutable_optimizer()->set_learning_rate(0.1f);
  table.mutable_embedding()->set_admit_after(2);
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1, table);
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 50; ++i) ids.push_back(i * 7919);
  std::vector<float> grads(ids.size() * kDim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = std::sin(static_cast<float>(i));
  ASSERT_THAT(Push(ids, grads, 1), IsOk());
  ASSERT_THAT(Push(ids, grads, 2), IsOk());
  ASSERT_THAT(Push({123456}, std::vector<float>(kDim, 1.0f), 3), IsOk());  // one pending id
  absl::StatusOr<tessera::v1::ShardCheckpoint> saved = store_.Snapshot(-1, absl::InfiniteFuture());
  ASSERT_THAT(saved, IsOk());
  ShardStore restored;
  std::vector<tessera::v1::ShardCheckpoint> files = {*saved};
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1, table, &restored, &files);
  EXPECT_EQ(*Pull(ids, &restored), *Pull(ids));
  EXPECT_EQ(Stats(&restored).rows(), 50);
  EXPECT_EQ(Stats(&restored).pending_ids(), 1);
  ASSERT_THAT(Push(ids, grads, 4), IsOk());
  ASSERT_THAT(Push(ids, grads, 4, 0, 0, 8, &restored), IsOk());
  EXPECT_EQ(*Pull(ids, &restored), *Pull(ids)) << "moments and step counts came back";
  ASSERT_THAT(Push({123456}, std::vector<float>(kDim, 1.0f), 5, 0, 0, 8, &restored), IsOk());
  EXPECT_EQ(Stats(&restored).rows(), 51) << "the pending id's first touch was kept";
}

// A delta checkpoint holds only the rows changed since the full one (and every id held); restoring the full one
// and then the delta gives the rows, state and step counts of the store that wrote them.
TEST_F(SparseTableTest, DeltaCheckpointRoundTripRestoresFullPlusDelta) {
  tessera::v1::ParameterSpec table = Table();
  table.mutable_embedding()->mutable_optimizer()->set_kind(tessera::v1::RowOptimizerSpec::LAZY_ADAM);
  table.mutable_embedding()->mutable_optimizer()->set_learning_rate(0.1f);
  table.mutable_embedding()->set_expire_after_steps(6);
  delta_checkpoints_ = true;
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1, table);
  std::vector<uint64_t> all;
  for (uint64_t i = 0; i < 200; ++i) all.push_back(i * 104729 + 5);
  auto grads_for = [](size_t rows, float g) { return std::vector<float>(rows * kDim, g); };
  ASSERT_THAT(Push(all, grads_for(all.size(), 0.5f), 1, /*clock=*/0), IsOk());
  absl::StatusOr<tessera::v1::ShardCheckpoint> full = store_.Snapshot(-1, absl::InfiniteFuture());
  ASSERT_THAT(full, IsOk());
  store_.NoteFullCheckpoint("ckpt-1/server-0.shard", *full);
  // After the full one: 20 rows change, 5 are new; and at clock 10 every row not updated since clock 3 expires
  // but those pushed again at clock 9 and 10.
  std::vector<uint64_t> changed(all.begin(), all.begin() + 20);
  for (uint64_t i = 0; i < 5; ++i) changed.push_back(9000000 + i);
  ASSERT_THAT(Push(changed, grads_for(changed.size(), -0.25f), 2, /*clock=*/1), IsOk());
  ASSERT_THAT(Push(changed, grads_for(changed.size(), 0.125f), 3, /*clock=*/9), IsOk());
  ASSERT_THAT(Push(changed, grads_for(changed.size(), 0.25f), 4, /*clock=*/10), IsOk());
  absl::StatusOr<tessera::v1::ShardCheckpoint> delta =
      store_.Snapshot(-1, absl::InfiniteFuture(), nullptr, "ckpt-1/server-0.shard");
  ASSERT_THAT(delta, IsOk());
  int64_t full_rows = 0, delta_rows = 0, held = 0;
  for (const auto& c : full->chunks()) full_rows += c.row_ids_size();
  for (const auto& c : delta->chunks()) {
    EXPECT_TRUE(c.delta());
    delta_rows += c.row_ids_size();
    held += c.all_row_ids_size();
  }
  EXPECT_EQ(full_rows, 200);
  EXPECT_LE(delta_rows, 25) << "a delta holds the changed rows only";
  EXPECT_EQ(held, Stats().rows()) << "and every id held";
  ShardStore restored;
  std::vector<tessera::v1::ShardCheckpoint> files = {*full, *delta};
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1, table, &restored, &files);
  std::vector<uint64_t> every = all;
  every.insert(every.end(), changed.begin() + 20, changed.end());
  EXPECT_EQ(*Pull(every, &restored), *Pull(every));
  EXPECT_EQ(Stats(&restored).rows(), Stats().rows());
  ASSERT_THAT(Push(changed, grads_for(changed.size(), 1.0f), 5, 11), IsOk());
  ASSERT_THAT(Push(changed, grads_for(changed.size(), 1.0f), 5, 11, 0, 8, &restored), IsOk());
  EXPECT_EQ(*Pull(changed, &restored), *Pull(changed)) << "step counts and moments came back";
  // A delta over a file this server did not write is whole; one over another version is refused.
  absl::StatusOr<tessera::v1::ShardCheckpoint> unknown_base =
      store_.Snapshot(-1, absl::InfiniteFuture(), nullptr, "ckpt-0/server-0.shard");
  ASSERT_THAT(unknown_base, IsOk());
  for (const auto& c : unknown_base->chunks()) EXPECT_FALSE(c.delta());
  tessera::v1::ChunkState older = full->chunks(0);
  older.set_version(older.version() + 1);
  EXPECT_THAT(ApplyRowDelta(older, delta->chunks(0)), StatusIs(absl::StatusCode::kFailedPrecondition, "version"));
}

// A job that writes no delta checkpoints keeps no per-row version (4 bytes less per row, counted so), and a
// snapshot asked for against a base is whole.
TEST_F(SparseTableTest, WithoutDeltaCheckpointsRowsKeepNoVersionAndSnapshotsAreWhole) {
  tessera::v1::ParameterSpec table = Table();
  absl::StatusOr<std::shared_ptr<const RowTableSpec>> with = RowTableFromDeclaration(table, true);
  absl::StatusOr<std::shared_ptr<const RowTableSpec>> without = RowTableFromDeclaration(table, false);
  ASSERT_THAT(with, IsOk());
  ASSERT_THAT(without, IsOk());
  EXPECT_EQ((*with)->RowBytes() - (*without)->RowBytes(), 4);
  Assign(tessera::v1::ConsistencySpec::ASYNC, 1, table);
  std::vector<uint64_t> ids = {1, 2, 3};
  ASSERT_THAT(Push(ids, std::vector<float>(ids.size() * kDim, 0.5f), 1, /*clock=*/0), IsOk());
  absl::StatusOr<tessera::v1::ShardCheckpoint> full = store_.Snapshot(-1, absl::InfiniteFuture());
  ASSERT_THAT(full, IsOk());
  store_.NoteFullCheckpoint("ckpt-1/server-0.shard", *full);
  ASSERT_THAT(Push({1}, std::vector<float>(kDim, 0.5f), 2, /*clock=*/1), IsOk());
  absl::StatusOr<tessera::v1::ShardCheckpoint> next =
      store_.Snapshot(-1, absl::InfiniteFuture(), nullptr, "ckpt-1/server-0.shard");
  ASSERT_THAT(next, IsOk());
  int64_t rows = 0;
  for (const auto& c : next->chunks()) {
    EXPECT_FALSE(c.delta());
    rows += c.row_ids_size();
  }
  EXPECT_EQ(rows, 3);
}

// A backup that takes its primary's logged updates holds the same rows as the primary.
TEST(RowSlotReplicationTest, ABackupApplyingThePrimarysUpdatesHoldsTheSameRows) {
  tessera::v1::ParameterSpec table = Table();
  table.mutable_embedding()->mutable_optimizer()->set_kind(tessera::v1::RowOptimizerSpec::ROWWISE_ADAGRAD);
  table.mutable_embedding()->set_expire_after_steps(8);
  absl::StatusOr<std::shared_ptr<const RowTableSpec>> spec = RowTableFromDeclaration(table, /*delta_checkpoints=*/false);
  ASSERT_THAT(spec, IsOk());
  RowMemory memory(0);
  RowSlot primary(*spec, 0, &memory), backup(*spec, 0, &memory);
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; ids.size() < 6; ++id) {
    if (EmbeddingSlot(id, kSlots) == 0) ids.push_back(id);
  }
  tessera::v1::ReplicateRequest request;
  {
    absl::MutexLock lock(&primary.mu);
    primary.replication.backups = {1};
    primary.replication.log_base = 0;
    for (int64_t clock = 0; clock < 20; ++clock) {
      std::vector<uint64_t> some(ids.begin(), ids.begin() + 1 + clock % ids.size());
      std::vector<float> grads(some.size() * kDim, 0.5f + static_cast<float>(clock));
      int64_t none = 0;
      // Every fifth update evicts the slot's least recently updated row outside it, as an evicting push does.
      const std::vector<uint64_t> evict = clock % 5 == 4 ? primary.OldestRowsLocked(1, some) : std::vector<uint64_t>();
      primary.ApplyLocked(some, grads, 1.0f, clock, none, evict);
    }
    for (const auto& u : primary.replication.log) *request.add_updates() = u;
    *request.mutable_state() = primary.ReplicaStateLocked(false);
    ASSERT_EQ(request.updates_size(), 20);
  }
  absl::MutexLock lock(&backup.mu);
  ASSERT_THAT(backup.TakeReplicaLocked(UpdateRule(tessera::v1::OptimizerSpec()), request, 1), IsOk());
  absl::MutexLock primary_lock(&primary.mu);
  tessera::v1::ChunkState a = primary.StateLocked(), b = backup.StateLocked();
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());
  EXPECT_GT(a.row_ids_size(), 0);
  // The whole state, taken instead of the updates, gives the same again.
  RowSlot fresh(*spec, 0, &memory);
  tessera::v1::ReplicateRequest whole;
  *whole.mutable_state() = a;
  absl::MutexLock fresh_lock(&fresh.mu);
  ASSERT_THAT(fresh.TakeReplicaLocked(UpdateRule(tessera::v1::OptimizerSpec()), whole, 1), IsOk());
  EXPECT_EQ(fresh.StateLocked().SerializeAsString(), a.SerializeAsString());
  // A state with a row of another slot is refused.
  tessera::v1::ReplicateRequest forged = whole;
  uint64_t other = 0;
  while (EmbeddingSlot(other, kSlots) == 0) ++other;
  forged.mutable_state()->set_row_ids(0, other);
  EXPECT_THAT(fresh.TakeReplicaLocked(UpdateRule(tessera::v1::OptimizerSpec()), forged, 1), StatusIs(absl::StatusCode::kInvalidArgument, ""));
}

}  // namespace
}  // namespace tessera
