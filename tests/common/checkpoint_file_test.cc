#include "common/model/checkpoint_file.h"

#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>

#include "common/base/crc32c.h"
#include "gtest/gtest.h"
#include "proto/checkpoint.pb.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

TEST(Crc32cTest, MatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("56789", Crc32c("1234")), 0xE3069283u) << "continues across pieces";
}

class CheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             ("tessera-ckpt-" + std::to_string(getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    shard_.set_server_id(2);
    auto* chunk = shard_.add_chunks();
    chunk->set_param("w");
    chunk->set_values(std::string(400, 'x'));
    chunk->set_version(17);
    (*chunk->mutable_last_seq())[1] = 99;
    ASSERT_THAT(WriteCheckpointFile(path_, {"job-a", 5, 120}, shard_), IsOk());
  }
  void TearDown() override { std::filesystem::remove(path_); }

  std::string Bytes() {
    std::ifstream in(path_, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }
  void Overwrite(const std::string& bytes) { std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes; }

  std::string path_;
  tessera::v1::ShardCheckpoint shard_;
};

TEST_F(CheckpointFileTest, RoundTripsTheMessageAndHeader) {
  tessera::v1::ShardCheckpoint read;
  absl::StatusOr<CheckpointHeader> header = ReadCheckpointFile(path_, &read);
  ASSERT_THAT(header, IsOk());
  EXPECT_EQ(header->job, "job-a");
  EXPECT_EQ(header->epoch, 5u);
  EXPECT_EQ(header->clock, 120);
  EXPECT_EQ(read.SerializeAsString(), shard_.SerializeAsString());
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp")) << "the temporary name is renamed away";
}

TEST_F(CheckpointFileTest, EveryDamageIsRefusedNamingTheFileAndTheCheck) {
  const std::string good = Bytes();
  tessera::v1::ShardCheckpoint read;
  struct Case {
    std::string bytes;
    std::string check;
  };
  std::string flipped_payload = good;
  flipped_payload[good.size() - 10] ^= 1;
  std::string flipped_header = good;
  flipped_header[14] ^= 1;  // inside the epoch
  std::string newer = good;
  newer[8] = 9;  // format version 9
  const std::vector<Case> cases = {
      {good.substr(0, good.size() - 1), "the payload is"},
      {good + "extra", "truncated or appended to"},
      {flipped_payload, "payload CRC-32C mismatch"},
      {flipped_header, "header CRC-32C mismatch"},
      {newer, "format version 9"},
      {good.substr(0, 20), "header is truncated"},
      {"not a checkpoint at all", "magic"},
  };
  for (const Case& c : cases) {
    Overwrite(c.bytes);
    EXPECT_THAT(ReadCheckpointFile(path_, &read).status(),
                StatusIs(absl::StatusCode::kDataLoss, "checkpoint file " + path_ + " is refused"));
    EXPECT_THAT(ReadCheckpointFile(path_, &read).status(), StatusIs(absl::StatusCode::kDataLoss, c.check));
  }
  EXPECT_THAT(ReadCheckpointFile(path_ + ".missing", &read).status(),
              StatusIs(absl::StatusCode::kNotFound, "does not exist"));
}

// A write that fails leaves nothing behind, and its code says what the caller should do (a full disk or a file
// size limit is not DATA_LOSS): here a file-size limit the process may not pass, as a full disk does.
TEST_F(CheckpointFileTest, AFailedWriteLeavesNoFileAndSaysWhy) {
  const std::string dir = ::testing::TempDir() + "/checkpoint-failed-write";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  tessera::v1::ShardCheckpoint big;
  big.add_chunks()->set_values(std::string(1 << 20, 'x'));
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 64 << 10;
  void (*previous)(int) = signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status written = WriteCheckpointFile(dir + "/server-0.shard", {"job", 1, 2}, big);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  signal(SIGXFSZ, previous);
  EXPECT_FALSE(written.ok());
  EXPECT_NE(written.code(), absl::StatusCode::kDataLoss) << written;
  EXPECT_NE(written.message().find("server-0.shard"), std::string::npos) << written;
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "a temporary file stayed";
  // A folder that is not there: NOT_FOUND, naming the file.
  const absl::Status missing = WriteCheckpointFile(dir + "/no/such/server-0.shard", {"job", 1, 2}, big);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
}

}  // namespace
}  // namespace tessera
