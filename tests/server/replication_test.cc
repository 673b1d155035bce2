// Replication between stores (ReplicationSpec): a primary answers an update only once its backups hold it, a
// backup taking over has every acknowledged update and its sequence table, SYNC rounds reach the backups once,
// and backups take state only from the chunk's primary. The stores talk through an in-process sender; the
// daemons' gRPC path is covered by tests/multiprocess.
#include <cstring>
#include <deque>
#include <map>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "common/job_spec.h"
#include "common/security.h"
#include "gtest/gtest.h"
#include "server/shard_store.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

constexpr int kServers = 3;

// Hands states to the stores by address ("s0", "s1", ...) with the sending server's key. While `hold` is set,
// hand-overs wait in a queue until Release().
class LoopbackSender : public ReplicaSender {
 public:
  LoopbackSender(std::map<std::string, ShardStore*>* stores, std::string key) : stores_(stores), key_(std::move(key)) {}

  void Send(const std::string& address, std::shared_ptr<const tessera::v1::ReplicateRequest> request,
            std::function<void(absl::Status)> done) override {
    {
      absl::MutexLock lock(&mu_);
      ++sent_;
      updates_ += request->updates_size();
      if (hold_) {
        held_.push_back({address, std::move(request), std::move(done)});
        return;
      }
    }
    Deliver(address, *request, done);
  }

  void set_hold(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_ = hold;
  }
  // Delivers the held hand-overs (and those they start, while held).
  void Release() {
    std::deque<Held> held;
    {
      absl::MutexLock lock(&mu_);
      held.swap(held_);
    }
    for (Held& h : held) Deliver(h.address, *h.request, h.done);
  }
  int sent() {
    absl::MutexLock lock(&mu_);
    return sent_;
  }
  // Updates sent as updates (not as a whole state).
  int updates() {
    absl::MutexLock lock(&mu_);
    return updates_;
  }

 private:
  struct Held {
    std::string address;
    std::shared_ptr<const tessera::v1::ReplicateRequest> request;
    std::function<void(absl::Status)> done;
  };
  void Deliver(const std::string& address, const tessera::v1::ReplicateRequest& request,
               const std::function<void(absl::Status)>& done) {
    auto it = stores_->find(address);
    if (it == stores_->end()) {
      done(absl::UnavailableError(address + " is gone"));
      return;
    }
    done(it->second->TakeReplica(request, key_).status());
  }

  std::map<std::string, ShardStore*>* const stores_;
  const std::string key_;
  absl::Mutex mu_;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  int sent_ ABSL_GUARDED_BY(mu_) = 0;
  int updates_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Held> held_ ABSL_GUARDED_BY(mu_);
};

// Parameter "w", 6 elements in two chunks of 3, primary server 0, backup server 1; SGD with momentum (so the
// optimizer state must travel too).
class ReplicationTest : public ::testing::Test {
 protected:
  ReplicationTest() {
    for (int i = 0; i < kServers; ++i) {
      keys_.push_back(NewSecret());
      senders_.push_back(std::make_unique<LoopbackSender>(&addresses_, keys_[i]));
      stores_.push_back(std::make_unique<ShardStore>(64 << 20, senders_[i].get()));
      addresses_[Address(i)] = stores_[i].get();
    }
  }
  ~ReplicationTest() override {
    for (auto& sender : senders_) sender->Release();
  }

  static std::string Address(int server) { return "s" + std::to_string(server); }

  void Start(tessera::v1::ConsistencySpec::Mode mode, int workers) {
    job_.mutable_model()->mutable_softmax_regression();
    job_.mutable_optimizer()->set_kind(tessera::v1::OptimizerSpec::SGD);
    job_.mutable_optimizer()->set_learning_rate(0.1f);
    job_.mutable_optimizer()->set_momentum(0.9f);
    job_.mutable_consistency()->set_mode(mode);
    job_.mutable_cluster()->set_num_workers(workers);
    job_.mutable_cluster()->set_num_servers(kServers);
    job_.mutable_replication()->set_backups(1);
    job_.mutable_stop()->set_max_steps(100);
    ApplyJobDefaults(job_);
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
      c->add_backup_server_ids(1);
    }
    View({0, 1, 2});
  }

  // Hands every store in `alive` the next view, with those servers.
  void View(const std::vector<int>& alive) {
    map_.set_epoch(map_.epoch() + 1);
    map_.clear_servers();
    for (int id : alive) {
      auto* s = map_.add_servers();
      s->set_id(id);
      s->set_address(Address(id));
      s->set_key_digest(KeyDigest(keys_[id]));
    }
    for (int id : alive) ASSERT_THAT(stores_[id]->Assign(map_, job_, id), IsOk()) << "server " << id;
  }

  // Server 0 is lost: server 1 takes over the chunks, server 2 becomes their backup.
  void FailOver() {
    addresses_.erase(Address(0));
    for (auto& c : *map_.mutable_chunks()) {
      c.set_server_id(1);
      c.clear_backup_server_ids();
      c.add_backup_server_ids(2);
    }
    View({1, 2});
  }

  struct Sent {
    ChunkPush push;
    std::vector<float> values;
  };
  Sent Gradient(int worker, uint64_t seq, int64_t clock, std::vector<float> values, int index = 0) {
    Sent s;
    s.push.address.epoch = map_.epoch();
    s.push.address.param = "w";
    s.push.address.index = index;
    s.push.worker_id = worker;
    s.push.seq = seq;
    s.push.clock = clock;
    s.push.read_clock_version = clock;
    s.push.batch_size = 1;
    s.values = std::move(values);
    return s;
  }

  // Starts a push on `server`; the slot is filled when the store answers it.
  std::shared_ptr<std::optional<absl::StatusOr<PushOutcome>>> Push(int server, const Sent& sent) {
    auto slot = std::make_shared<std::optional<absl::StatusOr<PushOutcome>>>();
    stores_[server]->Push(sent.push, SpanPayload(sent.values), [slot](absl::StatusOr<PushOutcome> outcome) {
      *slot = std::move(outcome);
    });
    return slot;
  }
  std::shared_ptr<std::optional<absl::StatusOr<ChunkValues>>> Exchange(int server, const Sent& sent) {
    auto slot = std::make_shared<std::optional<absl::StatusOr<ChunkValues>>>();
    stores_[server]->PushPull(sent.push, SpanPayload(sent.values),
                              std::make_shared<ExchangeWaiter>([slot](auto v) { *slot = std::move(v); }));
    return slot;
  }

  // The state of chunk w/`index` on `server`, which must be its primary, as a checkpoint saves it.
  tessera::v1::ChunkState State(int server, int index = 0) {
    absl::StatusOr<tessera::v1::ShardCheckpoint> snapshot = stores_[server]->Snapshot(-1, absl::InfiniteFuture());
    EXPECT_THAT(snapshot, IsOk());
    for (const auto& c : snapshot->chunks()) {
      if (c.index() == index) return c;
    }
    ADD_FAILURE() << "server " << server << " is not primary of w/" << index;
    return {};
  }

  tessera::v1::JobSpec job_;
  tessera::v1::ShardMap map_;
  std::vector<std::string> keys_;
  std::map<std::string, ShardStore*> addresses_;
  std::vector<std::unique_ptr<LoopbackSender>> senders_;
  std::vector<std::unique_ptr<ShardStore>> stores_;
};

TEST_F(ReplicationTest, APushIsAnsweredOnlyOnceItsBackupHoldsIt) {
  Start(tessera::v1::ConsistencySpec::ASYNC, 1);
  senders_[0]->Release();  // the first view's hand-overs
  senders_[0]->set_hold(true);
  auto answer = Push(0, Gradient(0, 1, 0, {1, 2, 3}));
  EXPECT_FALSE(answer->has_value()) << "answered before the backup held the update";
  senders_[0]->set_hold(false);
  senders_[0]->Release();
  ASSERT_TRUE(answer->has_value());
  ASSERT_THAT(**answer, IsOk());
  EXPECT_EQ((**answer)->version, 1);
}

TEST_F(ReplicationTest, ABackupTakingOverHasEveryAcknowledgedUpdateBitForBit) {
  Start(tessera::v1::ConsistencySpec::ASYNC, 2);
  uint64_t seq[2] = {0, 0};
  for (int step = 0; step < 20; ++step) {
    for (int w = 0; w < 2; ++w) {
      const float g = 0.37f * static_cast<float>(step + 1) / static_cast<float>(w + 3);
      auto answer = Push(0, Gradient(w, ++seq[w], step, {g, -g, g * g}));
      ASSERT_TRUE(answer->has_value());
      ASSERT_THAT(**answer, IsOk());
    }
  }
  const tessera::v1::ChunkState before = State(0);
  // Once in step, the backup got each update, not the state again (the first push may still go as the whole
  // state: the first view's hand-over can reach the backup before the backup has that view).
  EXPECT_GE(senders_[0]->updates(), 20 * 2 - 1) << "of 40 pushes to chunk 0";
  FailOver();
  const tessera::v1::ChunkState after = State(1);
  EXPECT_EQ(after.version(), before.version());
  EXPECT_EQ(after.values(), before.values()) << "values differ in their bits";
  EXPECT_EQ(after.optimizer_state(), before.optimizer_state()) << "momentum differs";
  // A retry of the last acknowledged push is recognised; a new push goes on from there.
  auto retry = Push(1, Gradient(1, seq[1], 19, {1, 1, 1}));
  ASSERT_TRUE(retry->has_value());
  ASSERT_THAT(**retry, IsOk());
  EXPECT_TRUE((**retry)->duplicate);
  auto next = Push(1, Gradient(1, ++seq[1], 20, {1, 1, 1}));
  ASSERT_TRUE(next->has_value());
  ASSERT_THAT(**next, IsOk());
  EXPECT_EQ((**next)->version, before.version() + 1);
  // Server 2, the new backup, was filled by server 1.
  EXPECT_GT(senders_[1]->sent(), 0);
}

// A SYNC round reaches the backup as one state once it closes; the pushes of a round still open when the
// primary is lost are not in the backup's sequence table, so their retries are collected again.
TEST_F(ReplicationTest, SyncRoundsReachTheBackupOnceAndAnOpenRoundIsCollectedAgain) {
  Start(tessera::v1::ConsistencySpec::SYNC, 2);
  senders_[0]->Release();
  const int sent_before = senders_[0]->sent();
  senders_[0]->set_hold(true);
  auto a = Exchange(0, Gradient(0, 1, 0, {1, 2, 3}));
  auto b = Exchange(0, Gradient(1, 1, 0, {3, 2, 1}));
  EXPECT_FALSE(a->has_value());
  EXPECT_FALSE(b->has_value()) << "the round's exchanges were answered before the backup held it";
  EXPECT_EQ(senders_[0]->sent() - sent_before, 1) << "one hand-over per round";
  senders_[0]->set_hold(false);
  senders_[0]->Release();
  ASSERT_TRUE(a->has_value() && b->has_value());
  ASSERT_THAT(**a, IsOk());
  ASSERT_THAT(**b, IsOk());
  // Round 1: worker 0's push arrives, then the primary is lost before worker 1's.
  auto open = Exchange(0, Gradient(0, 2, 1, {5, 5, 5}));
  EXPECT_FALSE(open->has_value());
  FailOver();  // the lost primary's exchange is never answered: its caller retries on the new primary
  auto retried = Exchange(1, Gradient(0, 2, 1, {5, 5, 5}));
  auto other = Exchange(1, Gradient(1, 2, 1, {1, 1, 1}));
  ASSERT_TRUE(retried->has_value() && other->has_value());
  ASSERT_THAT(**retried, IsOk());
  EXPECT_EQ((**retried)->version, 2) << "round 1 closed with both gradients on the new primary";
}

TEST_F(ReplicationTest, ABackupTakesStateOnlyFromTheChunksPrimary) {
  Start(tessera::v1::ConsistencySpec::ASYNC, 1);
  tessera::v1::ReplicateRequest request;
  request.set_epoch(map_.epoch());
  request.set_server_id(0);
  request.mutable_state()->set_param("w");
  request.mutable_state()->set_index(0);
  request.mutable_state()->set_values(std::string(3 * sizeof(float), '\0'));
  request.mutable_state()->set_optimizer_state(std::string(3 * sizeof(float), '\0'));
  request.mutable_state()->set_version(5);
  EXPECT_THAT(stores_[1]->TakeReplica(request, keys_[2]), StatusIs(absl::StatusCode::kUnauthenticated, ""));
  tessera::v1::ReplicateRequest from_two = request;
  from_two.set_server_id(2);
  EXPECT_THAT(stores_[1]->TakeReplica(from_two, keys_[2]), StatusIs(absl::StatusCode::kFailedPrecondition, ""));
  EXPECT_THAT(stores_[2]->TakeReplica(request, keys_[0]), StatusIs(absl::StatusCode::kFailedPrecondition, ""))
      << "server 2 backs up nothing";
  tessera::v1::ReplicateRequest ahead = request;
  ahead.set_epoch(map_.epoch() + 1);
  ahead.set_server_id(2);
  EXPECT_THAT(stores_[1]->TakeReplica(ahead, keys_[2]), StatusIs(absl::StatusCode::kAborted, ""))
      << "a newer view may make server 2 the primary: the backup waits for it";
  tessera::v1::ReplicateRequest wrong_size = request;
  wrong_size.mutable_state()->set_values(std::string(2 * sizeof(float), '\0'));
  EXPECT_THAT(stores_[1]->TakeReplica(wrong_size, keys_[0]), StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(stores_[1]->TakeReplica(request, keys_[0]), IsOk());
}

// A push waiting on a backup that is lost is answered once the view's new backup holds it.
TEST_F(ReplicationTest, AWaitingPushIsAnsweredOnceTheNewBackupHoldsIt) {
  Start(tessera::v1::ConsistencySpec::ASYNC, 1);
  senders_[0]->Release();
  addresses_.erase(Address(1));  // server 1 is gone: hand-overs to it fail
  auto answer = Push(0, Gradient(0, 1, 0, {1, 2, 3}));
  EXPECT_FALSE(answer->has_value());
  for (auto& c : *map_.mutable_chunks()) {
    c.clear_backup_server_ids();
    c.add_backup_server_ids(2);
  }
  View({0, 2});
  for (int i = 0; i < 100 && !answer->has_value(); ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(answer->has_value());
  ASSERT_THAT(**answer, IsOk());
  // Server 2 holds it: make it primary and compare.
  const tessera::v1::ChunkState primary = State(0);
  addresses_.erase(Address(0));
  for (auto& c : *map_.mutable_chunks()) {
    c.set_server_id(2);
    c.clear_backup_server_ids();
  }
  View({2});
  EXPECT_EQ(State(2).values(), primary.values());
}

// Two servers lost within moments: the primary is lost before it filled a new backup. The view that makes the
// unfilled copy primary leaves the chunk without its state, and every request for it says so (DATA_LOSS), rather
// than serving the initial values it holds.
TEST_F(ReplicationTest, ABackupPromotedBeforeItWasFilledRefusesToServeInitialValues) {
  Start(tessera::v1::ConsistencySpec::ASYNC, 1);
  senders_[0]->Release();
  auto answer = Push(0, Gradient(0, 1, 0, {1, 2, 3}));
  ASSERT_TRUE(answer->has_value());
  // Server 2 becomes a backup of server 0's chunks, but server 0 dies before it hands anything over.
  senders_[0]->set_hold(true);
  for (auto& c : *map_.mutable_chunks()) c.add_backup_server_ids(2);
  View({0, 1, 2});
  addresses_.erase(Address(0));
  addresses_.erase(Address(1));
  for (auto& c : *map_.mutable_chunks()) {
    c.set_server_id(2);
    c.clear_backup_server_ids();
  }
  View({2});
  Sent next = Gradient(0, 2, 1, {1, 1, 1});
  auto refused = Push(2, next);
  ASSERT_TRUE(refused->has_value());
  EXPECT_THAT(**refused, StatusIs(absl::StatusCode::kDataLoss, "lost its state"));
  EXPECT_THAT(stores_[2]->Pull(ChunkPull{{map_.epoch(), "w", 0}, -1}), StatusIs(absl::StatusCode::kDataLoss, ""));
  senders_[0]->set_hold(false);
}

}  // namespace
}  // namespace tessera
