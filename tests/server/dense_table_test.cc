// The dense kind of table through the Table interface that view adoption and replication use.
#include "server/tables/dense_table.h"

#include "common/model/job_spec.h"
#include "common/model/param_init.h"
#include "gtest/gtest.h"
#include "server/job_config.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using Role = Table::Role;

// Parameter "w" of 4 elements drawn from U(-1, 1), in two chunks: chunk 0 on server 0 (backed up on 1), chunk 1
// on server 1 (backed up on 0).
class DenseTableTest : public ::testing::Test {
 protected:
  DenseTableTest() {
    job_.mutable_model()->mutable_softmax_regression();
    job_.mutable_optimizer()->set_kind(tessera::v1::OptimizerSpec::ADAM);
    job_.mutable_cluster()->set_num_workers(2);
    job_.mutable_cluster()->set_num_servers(2);
    job_.mutable_stop()->set_max_steps(10);
    ApplyJobDefaults(job_);
    config_ = std::make_unique<JobConfig>(job_);
    auto* p = map_.add_params();
    p->set_name("w");
    p->add_shape(4);
    p->mutable_init()->set_kind(tessera::v1::InitSpec::UNIFORM);
    p->mutable_init()->set_scale(1.0f);
    p->mutable_init()->set_seed(7);
    for (int i = 0; i < 2; ++i) {
      auto* c = map_.add_chunks();
      c->set_param("w");
      c->set_index(i);
      c->set_offset(2 * i);
      c->set_length(2);
      c->set_server_id(i);
      c->add_backup_server_ids(1 - i);
    }
  }

  tessera::v1::JobSpec job_;
  std::unique_ptr<JobConfig> config_;
  tessera::v1::ShardMap map_;
  DenseTable table_;
};

TEST_F(DenseTableTest, PlacementsNameEveryChunkWithItsPrimaryAndBackups) {
  absl::StatusOr<std::vector<UnitPlacement>> placements = table_.Placements(map_);
  ASSERT_THAT(placements.status(), IsOk());
  ASSERT_EQ(placements->size(), 2u);
  EXPECT_EQ((*placements)[1].key, UnitKey("w", 1));
  EXPECT_EQ((*placements)[1].primary, 1);
  EXPECT_EQ((*placements)[1].backups, std::vector<int>{0});
  EXPECT_TRUE((*placements)[1].On(0));
  EXPECT_TRUE((*placements)[1].On(1));
  EXPECT_FALSE((*placements)[1].On(2));
}

TEST_F(DenseTableTest, ACreatedChunkHoldsItsInitialValuesAndOptimizerState) {
  const std::vector<UnitPlacement> placements = *table_.Placements(map_);
  ASSERT_THAT(table_.Create(*config_, map_, placements[0], Role::kPrimary, /*from_checkpoint=*/false).status(), IsOk());
  Chunk* chunk = table_.FindChunk({"w", 0});
  ASSERT_NE(chunk, nullptr);
  std::vector<float> whole(4);  // the same slice of the whole tensor made in one place
  FillInit(map_.params(0).init(), "w", 0, absl::MakeSpan(whole));
  absl::MutexLock lock(&chunk->mu);
  EXPECT_EQ(chunk->values, std::vector<float>(whole.begin(), whole.begin() + 2));
  EXPECT_NE(chunk->values, std::vector<float>(2, 0.0f));
  EXPECT_EQ(chunk->state.size(), 2u * config_->rule.state_slots());  // Adam: two moments per value
  EXPECT_EQ(chunk->applied_clocks, std::vector<int64_t>(2, 0));
  EXPECT_FALSE(chunk->replication.filled);  // a copy of its own, not from a primary or a checkpoint
}

TEST_F(DenseTableTest, AChunkFromACheckpointWaitsForItsStateAndCountsAsFilled) {
  const std::vector<UnitPlacement> placements = *table_.Placements(map_);
  absl::StatusOr<Unit*> unit = table_.Create(*config_, map_, placements[1], Role::kBackup, /*from_checkpoint=*/true);
  ASSERT_THAT(unit.status(), IsOk());
  Chunk* chunk = table_.FindChunk({"w", 1}, Role::kBackup);
  ASSERT_EQ(*unit, chunk);
  absl::MutexLock lock(&chunk->mu);
  EXPECT_EQ(chunk->values, std::vector<float>(2, 0.0f));
  EXPECT_TRUE(chunk->replication.filled);
}

TEST_F(DenseTableTest, AViewPlacingAnUndeclaredParameterIsRefused) {
  map_.mutable_chunks(1)->set_param("v");
  const std::vector<UnitPlacement> placements = *table_.Placements(map_);
  EXPECT_THAT(table_.Create(*config_, map_, placements[1], Role::kPrimary, false).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "declares no such parameter"));
  EXPECT_EQ(table_.FindChunk({"v", 1}), nullptr);
}

TEST_F(DenseTableTest, AChangeOfRoleKeepsTheUnitAndARetiredUnitStaysValid) {
  const std::vector<UnitPlacement> placements = *table_.Placements(map_);
  Unit* backup = *table_.Create(*config_, map_, placements[1], Role::kBackup, false);
  {
    absl::MutexLock lock(&backup->mu);
    backup->version = 7;
  }
  // Promotion: the same object, with the state it held, now served as primary.
  EXPECT_EQ(table_.ChangeRole({"w", 1}, Role::kPrimary), backup);
  EXPECT_EQ(table_.Find({"w", 1}, Role::kBackup), nullptr);
  EXPECT_EQ(table_.Find({"w", 1}, Role::kPrimary), backup);
  EXPECT_EQ(table_.ChangeRole({"w", 1}, Role::kPrimary), nullptr);  // not held as backup any more
  EXPECT_EQ(table_.Units(Role::kPrimary), std::vector<Unit*>{backup});

  table_.Retire({"w", 1}, Role::kPrimary);
  EXPECT_EQ(table_.Find({"w", 1}, Role::kPrimary), nullptr);
  EXPECT_TRUE(table_.Units(Role::kPrimary).empty());
  absl::MutexLock lock(&backup->mu);  // a request that found it before still holds a valid object
  EXPECT_EQ(backup->version, 7);
}

TEST_F(DenseTableTest, StatisticsCountPrimariesBytesAndBackups) {
  const std::vector<UnitPlacement> placements = *table_.Placements(map_);
  ASSERT_THAT(table_.Create(*config_, map_, placements[0], Role::kPrimary, false).status(), IsOk());
  ASSERT_THAT(table_.Create(*config_, map_, placements[1], Role::kBackup, false).status(), IsOk());
  {
    Chunk* primary = table_.FindChunk({"w", 0});
    absl::MutexLock lock(&primary->mu);
    primary->replication.backups = {1};  // not handed over yet
  }
  tessera::v1::ServerStats stats;
  table_.AddStats(stats);
  EXPECT_EQ(stats.chunks(), 1);
  EXPECT_EQ(stats.backup_chunks(), 1);
  EXPECT_EQ(stats.bytes(), 2 * static_cast<int64_t>(sizeof(float)));
  EXPECT_EQ(stats.optimizer_bytes(), 2 * config_->rule.state_slots() * static_cast<int64_t>(sizeof(float)));
  EXPECT_EQ(stats.unfilled_chunks(), 1);
}

}  // namespace
}  // namespace tessera
