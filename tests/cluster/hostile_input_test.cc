// Hostile and malformed requests over real gRPC, each a defect found by a client built from proto/ alone: the
// answer is a clear error, and nothing changes. The cluster runs with a job token, as the launcher's does; the
// attacker here is a registered worker (it has the token and its own member key).
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/security.h"
#include "common/base/tensor_codec.h"
#include "common/model/wire_limits.h"
#include "server/replica_auth.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cluster/mini_cluster.h"
#include "tests/testing/raw_rpc.h"
#include "tests/testing/status_matchers.h"

namespace tessera::testing {
namespace {

using tessera::v1::ConsistencySpec;
using tessera::v1::PushRequest;

constexpr char kPush[] = "/tessera.v1.ParameterServer/Push";
constexpr char kReplicate[] = "/tessera.v1.ParameterServer/Replicate";

tessera::v1::ParameterSpec Param(const std::string& name, std::vector<int64_t> shape) {
  tessera::v1::ParameterSpec p;
  p.set_name(name);
  p.set_dtype(tessera::v1::DT_FLOAT32);
  for (int64_t d : shape) p.add_shape(d);
  p.mutable_init()->set_kind(tessera::v1::InitSpec::UNIFORM);
  p.mutable_init()->set_scale(1.0f);
  return p;
}

// A job token in a file of the test's own.
std::string WriteTokenFile(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/", name, "-", getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/token";
  std::ofstream(path) << "0123456789abcdef0123456789abcdef\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  return path;
}

class HostileInputTest : public ::testing::Test {
 protected:
  void StartCluster(ConsistencySpec::Mode mode, int workers) {
    security_.token_file = WriteTokenFile(::testing::UnitTest::GetInstance()->current_test_info()->name());
    auto cluster = MiniCluster::Start(TestJob(mode, /*servers=*/2, workers), absl::Minutes(5), security_);
    ASSERT_THAT(cluster, IsOk());
    cluster_ = std::move(*cluster);
    // Every worker registers before the parameters are placed, so that all hold the same view.
    for (int i = 0; i < workers; ++i) {
      auto client = cluster_->ConnectClient();
      ASSERT_THAT(client, IsOk());
      clients_.push_back(std::move(*client));
    }
    for (auto& c : clients_) ASSERT_THAT(c->Declare({Param("w", {100})}), IsOk());
    scheduler_ = MakeChannel(cluster_->scheduler_address(), *Security::Plaintext());
    const tessera::v1::ShardMap& map = *clients_[0]->shard_map();
    server_ = MakeChannel(map.servers(map.chunks(0).server_id()).address(), *Security::Plaintext());
  }

  // The token, and with `as`, that worker's member key.
  Metadata Credentials(const PsClient* as = nullptr) const {
    Metadata m = {{kAuthorizationHeader, "Bearer 0123456789abcdef0123456789abcdef"}};
    if (as != nullptr) m.emplace_back(kMemberKeyHeader, as->member_key());
    return m;
  }

  // A push to chunk 0 of "w" in the name of `worker_id`, made by `sender`.
  PushRequest ChunkPush(const PsClient& sender, int worker_id, std::vector<float> values) {
    const tessera::v1::ShardMap& map = *sender.shard_map();
    PushRequest r;
    r.set_epoch(map.epoch());
    r.set_worker_id(worker_id);
    r.set_incarnation(clients_[worker_id]->incarnation());
    r.set_seq(1000 + next_seq_++);
    r.set_batch_size(1);
    r.mutable_key()->set_param("w");
    r.mutable_key()->set_index(0);
    EncodeFloats(values, r.mutable_data());
    return r;
  }

  int64_t Chunk0Length() const { return clients_[0]->shard_map()->chunks(0).length(); }

  std::vector<float> Values() {
    std::vector<float> values(100);
    clients_[0]->ForgetPulledValues();
    EXPECT_THAT(clients_[0]->Pull({"w"}, {absl::MakeSpan(values)}), IsOk());
    return values;
  }

  SecurityOptions security_;
  std::unique_ptr<MiniCluster> cluster_;
  std::vector<std::unique_ptr<PsClient>> clients_;
  std::shared_ptr<grpc::Channel> scheduler_;
  std::shared_ptr<grpc::Channel> server_;
  uint64_t next_seq_ = 0;
};

TEST_F(HostileInputTest, DeclareOfAnEnormousOrOverflowingShapeIsRefusedAndPlacesNothing) {
  StartCluster(ConsistencySpec::ASYNC, 1);
  EXPECT_THAT(clients_[0]->Declare({Param("huge", {int64_t{1} << 40})}),
              StatusIs(absl::StatusCode::kInvalidArgument, "elements"));
  const int64_t big = int64_t{1} << 32;
  EXPECT_THAT(clients_[0]->Declare({Param("overflow", {big, big, big})}),
              StatusIs(absl::StatusCode::kInvalidArgument, "elements"));
  EXPECT_THAT(clients_[0]->Declare({Param("negative", {-4, -4})}),
              StatusIs(absl::StatusCode::kInvalidArgument, "positive"));
  auto map = cluster_->scheduler().coordinator().GetShardMap();
  ASSERT_THAT(map, IsOk());
  ASSERT_EQ(map->params_size(), 1);
  EXPECT_EQ(map->params(0).name(), "w");
}

TEST_F(HostileInputTest, PushOfAnUnknownKindIsInvalidAndChangesNothing) {
  StartCluster(ConsistencySpec::ASYNC, 1);
  const std::vector<float> before = Values();
  PushRequest r = ChunkPush(*clients_[0], 0, std::vector<float>(Chunk0Length(), std::nanf("")));
  r.set_kind(static_cast<PushRequest::Kind>(5));
  r.set_batch_size(0);
  EXPECT_THAT(RawUnary(server_, kPush, r, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kInvalidArgument, "kind"));
  EXPECT_EQ(Values(), before);
}

TEST_F(HostileInputTest, AnAssignmentOfNonFiniteValuesIsInvalidAndChangesNothing) {
  StartCluster(ConsistencySpec::ASYNC, 1);
  const std::vector<float> before = Values();
  std::vector<float> values(Chunk0Length(), 1.0f);
  values[1] = std::nanf("");
  PushRequest r = ChunkPush(*clients_[0], 0, values);
  r.set_kind(PushRequest::ASSIGN);
  EXPECT_THAT(RawUnary(server_, kPush, r, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kInvalidArgument, "finite"));
  EXPECT_EQ(Values(), before);
}

TEST_F(HostileInputTest, OnlyTheSchedulerMayAssignShardsCheckpointDecideRoundsOrShutDownAServer) {
  StartCluster(ConsistencySpec::ASYNC, 1);
  const std::vector<float> before = Values();
  tessera::v1::AssignShardsRequest assign;
  *assign.mutable_shard_map() = *clients_[0]->shard_map();
  assign.mutable_shard_map()->set_epoch(std::numeric_limits<uint64_t>::max());
  assign.mutable_shard_map()->mutable_chunks(0)->set_length(int64_t{1} << 28);  // 1 GiB
  *assign.mutable_job() = clients_[0]->job();
  tessera::v1::CheckpointRequest checkpoint;
  checkpoint.set_path(::testing::TempDir() + "/forged.shard");
  tessera::v1::DecideRoundsRequest decide;
  decide.add_rounds()->set_round(0);
  const std::vector<std::pair<std::string, const google::protobuf::Message*>> calls = {
      {"AssignShards", &assign},
      {"Checkpoint", &checkpoint},
      {"DecideRounds", &decide},
      {"Shutdown", &tessera::v1::ShutdownRequest::default_instance()}};
  for (const auto& [method, request] : calls) {
    SCOPED_TRACE(method);
    EXPECT_THAT(RawUnary(server_, "/tessera.v1.ParameterServer/" + method, *request, Credentials(clients_[0].get())),
                StatusIs(absl::StatusCode::kUnauthenticated, "only the scheduler"));
    // A forged control key does no better.
    Metadata forged = Credentials(clients_[0].get());
    forged.emplace_back(kControlKeyHeader, "00000000000000000000000000000000");
    EXPECT_THAT(RawUnary(server_, "/tessera.v1.ParameterServer/" + method, *request, forged),
                StatusIs(absl::StatusCode::kUnauthenticated, "wrong key"));
  }
  EXPECT_FALSE(std::filesystem::exists(::testing::TempDir() + "/forged.shard"));
  // The server is still at its epoch and serving: a real push is applied.
  std::vector<float> grad(100, 1.0f);
  ASSERT_THAT(clients_[0]->Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());
  EXPECT_NE(Values(), before);
}

TEST_F(HostileInputTest, APushInAnotherWorkersNameIsRefusedAndThatWorkerGoesOn) {
  StartCluster(ConsistencySpec::ASYNC, 2);
  const std::vector<float> before = Values();
  PushRequest forged = ChunkPush(*clients_[0], /*worker_id=*/1, std::vector<float>(Chunk0Length(), 1.0f));
  forged.set_seq(std::numeric_limits<uint64_t>::max());
  EXPECT_THAT(RawUnary(server_, kPush, forged, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kUnauthenticated, "wrong member key"));
  EXPECT_THAT(RawUnary(server_, kPush, forged, Credentials()),
              StatusIs(absl::StatusCode::kUnauthenticated, "no member key"));
  EXPECT_EQ(Values(), before);
  // Worker 1's own pushes still count (its sequence was not poisoned).
  std::vector<float> grad(100, 1.0f);
  ASSERT_THAT(clients_[1]->Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());
  const std::vector<float> after = Values();
  EXPECT_NE(after, before);
  int64_t duplicates = 0;
  for (int s = 0; s < cluster_->num_servers(); ++s) duplicates += cluster_->server(s).store().Stats().duplicate_pushes();
  EXPECT_EQ(duplicates, 0);
}

TEST_F(HostileInputTest, AClockForAnotherWorkerOrOneThatJumpsIsRefusedAndTheGateStillWaits) {
  StartCluster(ConsistencySpec::SYNC, 2);
  tessera::v1::AdvanceClockRequest forged;
  forged.set_worker_id(1);
  forged.set_clock(std::numeric_limits<int64_t>::max());
  forged.set_wait_timeout_ms(100);
  EXPECT_THAT(RawUnary(scheduler_, "/tessera.v1.Scheduler/AdvanceClock", forged, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kUnauthenticated, "wrong key"));
  forged.set_worker_id(0);
  EXPECT_THAT(RawUnary(scheduler_, "/tessera.v1.Scheduler/AdvanceClock", forged, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kInvalidArgument, "jumped"));
  // Worker 1 is still at clock 0: worker 0's gate for step 1 does not open without it.
  EXPECT_THAT(cluster_->scheduler().coordinator().clocks(), ::testing::ElementsAre(0, 0));
  tessera::v1::AdvanceClockRequest own;
  own.set_worker_id(0);
  own.set_clock(1);
  own.set_wait_timeout_ms(200);
  EXPECT_THAT(RawUnary(scheduler_, "/tessera.v1.Scheduler/AdvanceClock", own, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "worker 1 at clock 0"));
}

TEST_F(HostileInputTest, AForgedReadClockIsRefusedAndLeavesTheStalenessAlone) {
  StartCluster(ConsistencySpec::SYNC, 1);
  PushRequest r = ChunkPush(*clients_[0], 0, std::vector<float>(Chunk0Length(), 0.5f));
  r.set_read_clock_version(std::numeric_limits<int64_t>::min());
  EXPECT_THAT(RawUnary(server_, kPush, r, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kInvalidArgument, "read clock"));
  r.set_clock(-1);
  r.set_read_clock_version(0);
  EXPECT_THAT(RawUnary(server_, kPush, r, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kInvalidArgument, "clock"));
  for (int s = 0; s < cluster_->num_servers(); ++s) {
    EXPECT_EQ(cluster_->server(s).store().Stats().staleness().max(), 0);
  }
}

TEST_F(HostileInputTest, EveryClockWaitEndsAtItsOwnDeadline) {
  StartCluster(ConsistencySpec::SYNC, 3);
  auto advance = [&](int worker, uint64_t wait_ms, absl::Duration call_timeout) {
    tessera::v1::AdvanceClockRequest r;
    r.set_worker_id(worker);
    r.set_clock(1);
    r.set_wait_timeout_ms(wait_ms);
    return RawUnary(scheduler_, "/tessera.v1.Scheduler/AdvanceClock", r, Credentials(clients_[worker].get()),
                    nullptr, call_timeout);
  };
  // Worker 0 waits long (worker 2 never advances in this test's first part).
  absl::Notification long_done;
  absl::Status long_status;
  std::thread long_wait([&] {
    long_status = advance(0, 20000, absl::Seconds(30));
    long_done.Notify();
  });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  EXPECT_THAT(advance(1, 200, absl::Seconds(30)), StatusIs(absl::StatusCode::kDeadlineExceeded, "deadline"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "a 200 ms wait was held behind a 20 s one";
  // A wait of 2^64-1 ms is as long as the longest allowed, not expired at once.
  absl::Notification huge_done;
  std::thread huge_wait([&] {
    EXPECT_THAT(advance(1, std::numeric_limits<uint64_t>::max(), absl::Seconds(30)), IsOk());
    huge_done.Notify();
  });
  EXPECT_FALSE(huge_done.WaitForNotificationWithTimeout(absl::Milliseconds(500)));
  // Worker 2 arrives: both waiting gates open.
  EXPECT_THAT(advance(2, 1000, absl::Seconds(30)), IsOk());
  EXPECT_TRUE(huge_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(long_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  huge_wait.join();
  long_wait.join();
  EXPECT_THAT(long_status, IsOk());
}

TEST_F(HostileInputTest, AWorkerWaitsAtOneGateAtATime) {
  StartCluster(ConsistencySpec::SYNC, 2);
  tessera::v1::AdvanceClockRequest r;
  r.set_worker_id(0);
  r.set_clock(1);
  r.set_wait_timeout_ms(20000);
  absl::Status first;
  std::thread waiting([&] {
    first = RawUnary(scheduler_, "/tessera.v1.Scheduler/AdvanceClock", r, Credentials(clients_[0].get()), nullptr,
                     absl::Seconds(30));
  });
  absl::SleepFor(absl::Milliseconds(200));
  r.set_wait_timeout_ms(100);
  const absl::Time start = absl::Now();
  EXPECT_THAT(RawUnary(scheduler_, "/tessera.v1.Scheduler/AdvanceClock", r, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "deadline"));
  waiting.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "the abandoned 20 s wait was kept";
  EXPECT_THAT(first, StatusIs(absl::StatusCode::kAborted, "advanced again"));
}

TEST_F(HostileInputTest, ReportsAreCheckedAndTheirRecordsBounded) {
  StartCluster(ConsistencySpec::ASYNC, 2);
  tessera::v1::ReportRequest r;
  r.set_worker_id(0);
  r.set_clock(1);
  r.set_device(std::string(1 << 20, 'x'));
  EXPECT_THAT(clients_[0]->Report(r), StatusIs(absl::StatusCode::kInvalidArgument, "device"));
  r.set_device("cpu");
  r.set_has_eval(true);
  r.set_test_accuracy(1.5);
  EXPECT_THAT(clients_[0]->Report(r), StatusIs(absl::StatusCode::kInvalidArgument, "accuracy"));
  r.set_test_accuracy(0.5);
  for (int i = 0; i < 200; ++i) ASSERT_THAT(clients_[0]->Report(r), IsOk());  // the same clock, again and again
  const nlohmann::json status = cluster_->scheduler().coordinator().StatusJson();
  EXPECT_EQ(status["history"].size(), 1u);
  // A report in another rank's name, e.g. of a target accuracy reached, is refused.
  r.set_worker_id(1);
  r.set_clock(2);
  r.set_test_accuracy(1.0);
  EXPECT_THAT(RawUnary(scheduler_, "/tessera.v1.Scheduler/Report", r, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kUnauthenticated, "wrong key"));
  EXPECT_FALSE(cluster_->scheduler().coordinator().finished());
}

TEST_F(HostileInputTest, ADoneOrHeartbeatInAnotherRanksNameIsRefusedAndTheJobGoesOn) {
  StartCluster(ConsistencySpec::ASYNC, 2);
  tessera::v1::DoneRequest done;
  done.set_worker_id(1);
  EXPECT_THAT(RawUnary(scheduler_, "/tessera.v1.Scheduler/Done", done, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kUnauthenticated, "wrong key"));
  done.set_failure("failed");  // a failure in another's name, too
  EXPECT_THAT(RawUnary(scheduler_, "/tessera.v1.Scheduler/Done", done, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kUnauthenticated, "wrong key"));
  // Its own failure, but a megabyte of it: refused, and worker 0 stays in the job.
  done.set_worker_id(0);
  done.set_failure(std::string(1 << 20, 'x'));
  EXPECT_THAT(RawUnary(scheduler_, "/tessera.v1.Scheduler/Done", done, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kInvalidArgument, "failure"));
  EXPECT_EQ(cluster_->scheduler().coordinator().StatusJson()["workers"][0]["state"], "alive");
  tessera::v1::HeartbeatRequest beat;
  beat.set_role(tessera::v1::SERVER);
  beat.set_id(0);
  EXPECT_THAT(RawUnary(scheduler_, "/tessera.v1.Scheduler/Heartbeat", beat, Credentials(clients_[0].get())),
              StatusIs(absl::StatusCode::kUnauthenticated, "wrong key"));
  for (int role : {0, 99}) {
    beat.set_role(static_cast<tessera::v1::Role>(role));
    EXPECT_THAT(RawUnary(scheduler_, "/tessera.v1.Scheduler/Heartbeat", beat, Credentials(clients_[0].get())),
                StatusIs(absl::StatusCode::kInvalidArgument, "role"));
  }
  // Worker 0 may finish for itself; the job waits for worker 1.
  ASSERT_THAT(clients_[0]->Done(), IsOk());
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(cluster_->scheduler().coordinator().finished());
}

TEST_F(HostileInputTest, APullFromAWorkerIdOutsideTheJobIsInvalid) {
  StartCluster(ConsistencySpec::ASYNC, 1);
  tessera::v1::PullRequest r;
  r.set_epoch(clients_[0]->epoch());
  r.set_worker_id(7);
  r.mutable_key()->set_param("w");
  EXPECT_THAT(RawUnary(server_, "/tessera.v1.ParameterServer/Pull", r, Credentials()),
              StatusIs(absl::StatusCode::kInvalidArgument, "worker id 7"));
}

TEST_F(HostileInputTest, EveryMethodAnswersUnparsableBytesWithInvalidArgumentAndAMessage) {
  StartCluster(ConsistencySpec::ASYNC, 1);
  const std::string garbage("\xff\xff\xff\xff\x0f", 5);
  for (const char* method : {"Register", "Heartbeat", "Declare", "GetShardMap", "AdvanceClock", "Report", "Done"}) {
    SCOPED_TRACE(method);
    EXPECT_THAT(RawUnary(scheduler_, absl::StrCat("/tessera.v1.Scheduler/", method), garbage, Credentials()),
                StatusIs(absl::StatusCode::kInvalidArgument, "malformed tessera.v1."));
  }
  for (const char* method :
       {"Pull", "Push", "PushPull", "AssignShards", "Checkpoint", "GetStats", "DecideRounds", "Shutdown"}) {
    SCOPED_TRACE(method);
    EXPECT_THAT(RawUnary(server_, absl::StrCat("/tessera.v1.ParameterServer/", method), garbage, Credentials()),
                StatusIs(absl::StatusCode::kInvalidArgument, "malformed tessera.v1."));
  }
}

TEST_F(HostileInputTest, IdleHttpConnectionsDoNotHoldUpHealthz) {
  StartCluster(ConsistencySpec::ASYNC, 1);
  const int port = cluster_->scheduler().http_port();
  std::vector<int> idle;
  for (int i = 0; i < 16; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    idle.push_back(fd);
  }
  absl::SleepFor(absl::Milliseconds(100));
  httplib::Client client("127.0.0.1", port);
  const absl::Time start = absl::Now();
  httplib::Result result = client.Get("/healthz");
  const absl::Duration took = absl::Now() - start;
  for (int fd : idle) close(fd);
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
  EXPECT_LT(took, absl::Seconds(2)) << "16 idle connections held /healthz up";
}

// A Replicate call of one chunk's hand-over.
tessera::v1::ReplicateBatch Batch(const tessera::v1::ReplicateRequest& unit) {
  tessera::v1::ReplicateBatch batch;
  *batch.add_units() = unit;
  return batch;
}

// A Replicate from a client of our own: a member key (any token holder gets one) proves nothing between servers.
// Without the named primary's credential for this server nothing is taken; a future epoch and out-of-bound numbers
// are refused before anything else.
TEST_F(HostileInputTest, AReplicateWithoutItsPrimarysSignatureTakesNothing) {
  StartCluster(ConsistencySpec::ASYNC, 1);
  const std::vector<float> before = Values();
  const tessera::v1::ShardMap& map = *clients_[0]->shard_map();
  tessera::v1::ReplicateRequest r;
  r.set_epoch(map.epoch());
  r.set_server_id(1 - map.chunks(0).server_id());
  r.mutable_state()->set_param("w");
  r.mutable_state()->set_index(0);
  r.mutable_state()->set_values(std::string(Chunk0Length() * sizeof(float), '\0'));
  r.mutable_state()->set_version(1000);
  Metadata with_key = Credentials(clients_[0].get());
  EXPECT_THAT(RawUnary(server_, kReplicate, Batch(r), with_key),
              StatusIs(absl::StatusCode::kUnauthenticated, "not signed"));
  Metadata forged = with_key;
  forged.emplace_back(kReplicaCredentialHeader, std::string(kReplicaCredentialBytes, 's'));
  EXPECT_THAT(RawUnary(server_, kReplicate, Batch(r), forged),
              StatusIs(absl::StatusCode::kUnauthenticated, "not signed by"));
  tessera::v1::ReplicateRequest future = r;
  future.set_epoch(map.epoch() + 1000);
  EXPECT_THAT(RawUnary(server_, kReplicate, Batch(future), forged), StatusIs(absl::StatusCode::kAborted, "epoch"));
  for (uint64_t epoch : {kMaxEpoch + 1, uint64_t{std::numeric_limits<int64_t>::max()}, ~uint64_t{0}}) {
    future.set_epoch(epoch);
    EXPECT_THAT(RawUnary(server_, kReplicate, Batch(future), forged),
                StatusIs(absl::StatusCode::kInvalidArgument, "epoch"))
        << epoch;
  }
  tessera::v1::ReplicateRequest huge = r;
  huge.mutable_state()->set_version(std::numeric_limits<int64_t>::max());
  EXPECT_THAT(RawUnary(server_, kReplicate, Batch(huge), forged),
              StatusIs(absl::StatusCode::kInvalidArgument, "version"));
  (*r.mutable_state()->mutable_last_seq())[0] = ~uint64_t{0};
  EXPECT_THAT(RawUnary(server_, kReplicate, Batch(r), forged),
              StatusIs(absl::StatusCode::kInvalidArgument, "sequence"));
  EXPECT_EQ(Values(), before);
  std::vector<float> grad(100, 1.0f);
  ASSERT_THAT(clients_[0]->Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());
  EXPECT_NE(Values(), before) << "the worker's next push is taken (not a duplicate)";
}

}  // namespace
}  // namespace tessera::testing
