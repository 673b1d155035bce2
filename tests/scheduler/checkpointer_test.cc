#include "scheduler/recovery/checkpointer.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "tests/testing/fake_server_control.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using ::tessera::testing::FakeServerControl;
using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("checkpointer-", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    job_.set_name("ckpt-job");
    job_.set_seed(7);
    job_.mutable_model()->mutable_mlp()->add_hidden_sizes(16);
    job_.mutable_cluster()->set_num_servers(2);
    job_.mutable_cluster()->set_num_workers(2);
    job_.mutable_checkpoint()->set_dir(dir_.string());
    job_.mutable_checkpoint()->set_every_steps(100);
    job_.mutable_checkpoint()->set_keep(2);
    servers_.set_job_name(job_.name());
    view_.set_epoch(3);
    for (int id = 0; id < 2; ++id) {
      auto* server = view_.add_servers();
      server->set_id(id);
      server->set_address(absl::StrCat("s", id, ":1"));
      view_.add_workers()->set_id(id);
      auto* chunk = view_.add_chunks();
      chunk->set_server_id(id);
    }
  }

  absl::StatusOr<CheckpointInfo> Take(Checkpointer& checkpointer, int64_t clock) {
    return checkpointer.Take(view_, clock, /*at_version=*/false, {clock, clock}, absl::Seconds(1));
  }

  int Folders() const {
    int n = 0;
    if (fs::exists(dir_)) {
      for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_)) ++n;
    }
    return n;
  }

  fs::path dir_;
  tessera::v1::JobSpec job_;
  tessera::v1::ShardMap view_;
  FakeServerControl servers_;
};

TEST_F(CheckpointerTest, IsDueEveryStepsOfTheCadenceCountedFromTheLatest) {
  Checkpointer checkpointer(job_, &servers_, absl::Now());
  ASSERT_TRUE(checkpointer.enabled());
  const absl::Time now = absl::Now();
  EXPECT_FALSE(checkpointer.Due(99, now));
  EXPECT_TRUE(checkpointer.Due(100, now));
  ASSERT_THAT(Take(checkpointer, 100), IsOk());
  EXPECT_FALSE(checkpointer.Due(150, now + absl::Hours(1))) << "no time cadence: only steps count";
  EXPECT_TRUE(checkpointer.Due(200, now));

  job_.mutable_checkpoint()->clear_dir();
  Checkpointer off(job_, &servers_, absl::Now());
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.Due(1000, now));
  EXPECT_THAT(Take(off, 100).status(), StatusIs(absl::StatusCode::kFailedPrecondition, "checkpoints are off"));
}

TEST_F(CheckpointerTest, TakesCompleteCheckpointsKeepsTheNewestAndLoadsTheLatest) {
  Checkpointer checkpointer(job_, &servers_, absl::Now());
  for (int64_t clock : {100, 200, 300}) ASSERT_THAT(Take(checkpointer, clock), IsOk());
  EXPECT_EQ(Folders(), 2) << "checkpoint.keep is 2";
  ASSERT_TRUE(checkpointer.latest().has_value());
  EXPECT_EQ(checkpointer.latest()->number, 3);
  EXPECT_EQ(checkpointer.stats().taken, 3);

  absl::StatusOr<CheckpointInfo> loaded = Checkpointer::LoadLatest(dir_.string(), job_.name());
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(loaded->number, 3);
  EXPECT_EQ(loaded->state.clock(), 300);
  EXPECT_EQ(loaded->shard_files.size(), 2u);
  EXPECT_EQ(loaded->state.view().epoch(), 3u);
  EXPECT_THAT(Checkpointer::CheckResumable(job_, *loaded), IsOk());

  // An incomplete newest checkpoint (no scheduler file) is passed over for the one before.
  fs::remove(fs::path(loaded->folder) / Checkpointer::kSchedulerFile);
  loaded = Checkpointer::LoadLatest(dir_.string(), job_.name());
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(loaded->state.clock(), 200);
  EXPECT_THAT(Checkpointer::LoadLatest(dir_.string(), "another-job").status(),
              StatusIs(absl::StatusCode::kNotFound, "no usable checkpoint"));
}

// checkpoint.full_every 3: a full checkpoint, two deltas over it, a full one again. A delta names its full one,
// loads with the full one's files before its own, and keeps its full one from being pruned.
TEST_F(CheckpointerTest, DeltasBetweenFullCheckpointsNameTheirBaseWhichPruningKeeps) {
  job_.mutable_checkpoint()->set_full_every(3);
  Checkpointer checkpointer(job_, &servers_, absl::Now());
  std::vector<std::string> bases;
  for (int64_t clock : {100, 200, 300, 400, 500}) {
    absl::StatusOr<CheckpointInfo> taken = Take(checkpointer, clock);
    ASSERT_THAT(taken, IsOk());
    bases.push_back(taken->state.base());
  }
  EXPECT_EQ(bases, (std::vector<std::string>{"", "ckpt-000001", "ckpt-000001", "", "ckpt-000004"}));
  // keep 2: checkpoints 4 and 5, and nothing else (5's base is 4).
  EXPECT_EQ(Folders(), 2);
  absl::StatusOr<CheckpointInfo> loaded = Checkpointer::LoadLatest(dir_.string(), job_.name());
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(loaded->number, 5);
  ASSERT_EQ(loaded->shard_files.size(), 4u) << "the full checkpoint's two files, then the delta's two";
  EXPECT_NE(loaded->shard_files[0].find("ckpt-000004/server-0.shard"), std::string::npos);
  EXPECT_NE(loaded->shard_files[2].find("ckpt-000005/server-0.shard"), std::string::npos);

  // The next delta (6, over 4) keeps 4 while 5 goes: 4 is the base of a kept delta.
  job_.mutable_checkpoint()->set_keep(1);
  Checkpointer one(job_, &servers_, absl::Now());
  ASSERT_THAT(Take(one, 600), IsOk());  // a new scheduler knows no full one: this is full
  ASSERT_THAT(Take(one, 700), IsOk());  // a delta over 6
  EXPECT_EQ(Folders(), 2) << "the delta and its full one";
  // A delta whose full checkpoint is gone is refused; there is nothing before it.
  fs::remove_all(dir_ / "ckpt-000006");
  EXPECT_THAT(Checkpointer::LoadLatest(dir_.string(), job_.name()).status(),
              StatusIs(absl::StatusCode::kNotFound, "no usable checkpoint"));
}

TEST_F(CheckpointerTest, AFailedCheckpointLeavesNothingIsCountedAndBacksOff) {
  Checkpointer checkpointer(job_, &servers_, absl::Now());
  ASSERT_THAT(Take(checkpointer, 100), IsOk());
  servers_.FailCheckpoints(absl::ResourceExhaustedError("server 1: No space left on device"));
  EXPECT_THAT(Take(checkpointer, 200).status(), StatusIs(absl::StatusCode::kResourceExhausted, "server 1"));
  EXPECT_EQ(Folders(), 1) << "the failed checkpoint's folder is removed";
  CheckpointStats stats = checkpointer.stats();
  EXPECT_EQ(stats.taken, 1);
  EXPECT_EQ(stats.failed, 1);
  EXPECT_EQ(stats.consecutive_failures, 1);
  EXPECT_NE(stats.last_error.find("No space left"), std::string::npos);
  EXPECT_EQ(checkpointer.latest()->state.clock(), 100) << "the previous checkpoint stays the latest";

  // Retried after 1 s, then 2 s: never at once.
  const absl::Time failed_at = absl::Now();
  EXPECT_FALSE(checkpointer.Due(200, failed_at));
  EXPECT_TRUE(checkpointer.Due(200, failed_at + absl::Seconds(1.5)));
  EXPECT_THAT(Take(checkpointer, 200).status(), StatusIs(absl::StatusCode::kResourceExhausted, "server 1"));
  const absl::Time failed_again = absl::Now();
  EXPECT_FALSE(checkpointer.Due(200, failed_again + absl::Seconds(1.5)));
  EXPECT_TRUE(checkpointer.Due(200, failed_again + absl::Seconds(2.5)));
  EXPECT_EQ(checkpointer.stats().consecutive_failures, 2);

  servers_.FailCheckpoints(absl::OkStatus());
  absl::StatusOr<CheckpointInfo> taken = Take(checkpointer, 200);
  ASSERT_THAT(taken, IsOk());
  EXPECT_EQ(taken->number, 4) << "the numbers of failed checkpoints are not reused";
  EXPECT_EQ(checkpointer.stats().consecutive_failures, 0);
}

TEST_F(CheckpointerTest, AFolderThatIsAFileIsRefusedAtStart) {
  EXPECT_THAT(Checkpointer::CheckFolder(dir_.string()), IsOk()) << "a missing folder is created";
  const fs::path file = dir_ / "a-file";
  std::ofstream(file) << "x";
  EXPECT_THAT(Checkpointer::CheckFolder(file.string()),
              StatusIs(absl::StatusCode::kInvalidArgument, file.string()));
}

TEST_F(CheckpointerTest, AResumeOfAnotherModelOrSeedIsRefusedNamingTheField) {
  Checkpointer checkpointer(job_, &servers_, absl::Now());
  absl::StatusOr<CheckpointInfo> taken = Take(checkpointer, 100);
  ASSERT_THAT(taken, IsOk());
  tessera::v1::JobSpec other = job_;
  other.mutable_model()->mutable_mlp()->set_hidden_sizes(0, 32);
  EXPECT_THAT(Checkpointer::CheckResumable(other, *taken),
              StatusIs(absl::StatusCode::kFailedPrecondition, "job field model differs"));
  other = job_;
  other.set_seed(8);
  EXPECT_THAT(Checkpointer::CheckResumable(other, *taken),
              StatusIs(absl::StatusCode::kFailedPrecondition, "job field seed differs"));
  other = job_;
  other.mutable_cluster()->set_num_workers(3);
  EXPECT_THAT(Checkpointer::CheckResumable(other, *taken), StatusIs(absl::StatusCode::kFailedPrecondition, "workers"));
  other = job_;
  other.mutable_stop()->set_max_steps(5000);  // what may change on a resume
  EXPECT_THAT(Checkpointer::CheckResumable(other, *taken), IsOk());
}

}  // namespace
}  // namespace tessera
