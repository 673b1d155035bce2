// Replication between stores (ReplicationSpec): a primary answers an update only once its backups hold it, a
// backup taking over has every acknowledged update and its sequence table, SYNC rounds reach the backups once,
// and backups take state only from the chunk's primary. The stores talk through an in-process sender; the
// daemons' gRPC path is covered by tests/multiprocess.
#include <cmath>
#include <cstring>
#include <functional>
#include <deque>
#include <limits>
#include <map>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/model/job_spec.h"
#include "common/rpc/security.h"
#include "common/model/wire_limits.h"
#include "gtest/gtest.h"
#include "server/replica_auth.h"
#include "server/shard_store.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

constexpr int kServers = 3;

// Hands states to the stores by address ("s0", "s1", ...), each with the sending server's credential for its
// backup, as GrpcReplicaSender does. While `hold` is set, hand-overs wait in a queue until Release().
// `answer_offset` is added to the version a backup answers with (a backup that says it holds another version).
class LoopbackSender : public ReplicaSender {
 public:
  LoopbackSender(std::map<std::string, ShardStore*>* stores, std::shared_ptr<const ReplicaKey> key)
      : stores_(stores), key_(std::move(key)) {}

  void Send(const ReplicaTarget& backup, std::shared_ptr<const tessera::v1::ReplicateRequest> request,
            std::function<void(absl::StatusOr<int64_t>)> done) override {
    {
      absl::MutexLock lock(&mu_);
      ++sent_;
      updates_ += request->updates_size();
      if (hold_) {
        held_.push_back({backup, std::move(request), std::move(done)});
        return;
      }
    }
    Deliver(backup, *request, done);
  }

  void set_hold(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_ = hold;
  }
  void set_answer_offset(int64_t offset) {
    absl::MutexLock lock(&mu_);
    answer_offset_ = offset;
  }
  // Delivers the held hand-overs (and those they start, while held).
  void Release() {
    std::deque<Held> held;
    {
      absl::MutexLock lock(&mu_);
      held.swap(held_);
    }
    for (Held& h : held) Deliver(h.backup, *h.request, h.done);
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
  // The last request sent, as a backup received it.
  std::optional<tessera::v1::ReplicateRequest> last() {
    absl::MutexLock lock(&mu_);
    return last_;
  }

 private:
  struct Held {
    ReplicaTarget backup;
    std::shared_ptr<const tessera::v1::ReplicateRequest> request;
    std::function<void(absl::StatusOr<int64_t>)> done;
  };
  void Deliver(const ReplicaTarget& backup, const tessera::v1::ReplicateRequest& request,
               const std::function<void(absl::StatusOr<int64_t>)>& done) {
    int64_t offset;
    {
      absl::MutexLock lock(&mu_);
      last_ = request;
      offset = answer_offset_;
    }
    auto it = stores_->find(backup.address);
    if (it == stores_->end()) {
      done(absl::UnavailableError(backup.address + " is gone"));
      return;
    }
    const std::string credential =
        key_->Credential(backup.replication_key, backup.server_id, backup.incarnation, request);
    absl::StatusOr<int64_t> held = it->second->TakeReplica(request, credential);
    if (held.ok()) held = *held + offset;
    done(held);
  }

  std::map<std::string, ShardStore*>* const stores_;
  const std::shared_ptr<const ReplicaKey> key_;
  absl::Mutex mu_;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  int64_t answer_offset_ ABSL_GUARDED_BY(mu_) = 0;
  int sent_ ABSL_GUARDED_BY(mu_) = 0;
  int updates_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<tessera::v1::ReplicateRequest> last_ ABSL_GUARDED_BY(mu_);
  std::deque<Held> held_ ABSL_GUARDED_BY(mu_);
};

// Parameter "w", 6 elements in two chunks of 3, primary server 0, backup server 1; SGD with momentum (so the
// optimizer state must travel too).
class ReplicationTest : public ::testing::Test {
 protected:
  ReplicationTest() {
    for (int i = 0; i < kServers; ++i) {
      absl::StatusOr<std::unique_ptr<ReplicaKey>> key = ReplicaKey::Generate();
      EXPECT_THAT(key, IsOk());
      keys_.push_back(std::move(*key));
      senders_.push_back(std::make_unique<LoopbackSender>(&addresses_, keys_[i]));
      stores_.push_back(std::make_unique<ShardStore>(64 << 20, senders_[i].get(), 0, keys_[i]));
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
      s->set_incarnation(1);
      s->set_replication_key(keys_[id]->public_key());
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
  // `from`'s credential of `request` for server `to` (incarnation 1), as its sender makes it.
  std::string Signed(int from, const tessera::v1::ReplicateRequest& request, int to) {
    return keys_[from]->Credential(keys_[to]->public_key(), to, 1, request);
  }

  std::vector<std::shared_ptr<const ReplicaKey>> keys_;
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
  EXPECT_THAT(stores_[1]->TakeReplica(request, Signed(2, request, 1)), StatusIs(absl::StatusCode::kUnauthenticated, ""));
  tessera::v1::ReplicateRequest from_two = request;
  from_two.set_server_id(2);
  EXPECT_THAT(stores_[1]->TakeReplica(from_two, Signed(2, from_two, 1)),
              StatusIs(absl::StatusCode::kFailedPrecondition, ""));
  EXPECT_THAT(stores_[2]->TakeReplica(request, Signed(0, request, 2)), StatusIs(absl::StatusCode::kFailedPrecondition, ""))
      << "server 2 backs up nothing";
  tessera::v1::ReplicateRequest ahead = request;
  ahead.set_epoch(map_.epoch() + 1);
  ahead.set_server_id(2);
  EXPECT_THAT(stores_[1]->TakeReplica(ahead, Signed(2, ahead, 1)), StatusIs(absl::StatusCode::kAborted, ""))
      << "a newer view may make server 2 the primary: the backup waits for it";
  tessera::v1::ReplicateRequest wrong_size = request;
  wrong_size.mutable_state()->set_values(std::string(2 * sizeof(float), '\0'));
  EXPECT_THAT(stores_[1]->TakeReplica(wrong_size, Signed(0, wrong_size, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(stores_[1]->TakeReplica(request, Signed(0, request, 1)), IsOk());
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

// A primary's hand-overs to one backup go in one call with one credential: it covers every unit (a unit alone
// does not carry it); what concerns one chunk is that chunk's result; a number out of bounds in any unit, or units
// of two primaries, refuse the whole call and take nothing.
TEST_F(ReplicationTest, OneAuthenticatedCallCarriesTheHandOversOfManyChunks) {
  Start(tessera::v1::ConsistencySpec::ASYNC, 1);
  tessera::v1::ReplicateRequest held;
  held.set_epoch(map_.epoch());
  held.set_server_id(0);
  *held.mutable_state() = State(0);
  held.mutable_state()->set_version(5);
  tessera::v1::ReplicateRequest not_backed_up = held;
  not_backed_up.mutable_state()->set_index(99);
  tessera::v1::ReplicateRequest out_of_bounds = not_backed_up;
  out_of_bounds.mutable_state()->set_version(std::numeric_limits<int64_t>::max());
  auto signed_for_one = [this](const tessera::v1::ReplicateBatch& batch) {
    return keys_[0]->Credential(keys_[1]->public_key(), 1, 1, batch);
  };

  tessera::v1::ReplicateBatch refused;
  *refused.add_units() = held;
  *refused.add_units() = out_of_bounds;
  EXPECT_THAT(stores_[1]->TakeReplicas(refused, signed_for_one(refused)),
              StatusIs(absl::StatusCode::kInvalidArgument, "version"));
  tessera::v1::ReplicateBatch two_primaries;
  *two_primaries.add_units() = held;
  *two_primaries.add_units() = held;
  two_primaries.mutable_units(1)->set_server_id(2);
  EXPECT_THAT(stores_[1]->TakeReplicas(two_primaries, signed_for_one(two_primaries)),
              StatusIs(absl::StatusCode::kInvalidArgument, "from server 2"));

  tessera::v1::ReplicateBatch batch;
  held.mutable_state()->set_version(3);
  *batch.add_units() = held;
  *batch.add_units() = not_backed_up;
  const std::string credential = signed_for_one(batch);
  EXPECT_THAT(stores_[1]->TakeReplica(held, credential), StatusIs(absl::StatusCode::kUnauthenticated, ""))
      << "the call's credential taken for one of its units";
  absl::StatusOr<std::vector<absl::StatusOr<int64_t>>> results = stores_[1]->TakeReplicas(batch, credential);
  ASSERT_THAT(results, IsOk());
  ASSERT_EQ(results->size(), 2u);
  ASSERT_THAT((*results)[0], IsOk());
  EXPECT_EQ(*(*results)[0], 3) << "version 5 of the refused call was not taken";
  EXPECT_THAT((*results)[1], StatusIs(absl::StatusCode::kFailedPrecondition, "does not back up"));
  EXPECT_THAT(stores_[1]->TakeReplicas(tessera::v1::ReplicateBatch(), ""),
              StatusIs(absl::StatusCode::kInvalidArgument, "without a chunk"));
}

// A backup takes a state only with its primary's credential of that very request for this very backup: none,
// one for another backup, one by another server (the backup itself included), a request changed after it was
// made, or a credential with a bit of its nonce or tag changed are UNAUTHENTICATED, and a view without the
// primary's key checks nothing in. No member key is needed or sent: what a backup receives lets it act as its
// primary toward nobody. Every credential has a fresh nonce.
TEST_F(ReplicationTest, ABackupTakesAStateOnlyWithItsPrimarysCredentialForItself) {
  Start(tessera::v1::ConsistencySpec::ASYNC, 1);
  tessera::v1::ReplicateRequest request;
  request.set_epoch(map_.epoch());
  request.set_server_id(0);
  *request.mutable_state() = State(0);
  request.mutable_state()->set_version(3);
  const auto unauthenticated = StatusIs(absl::StatusCode::kUnauthenticated, "");
  EXPECT_THAT(stores_[1]->TakeReplica(request, ""), StatusIs(absl::StatusCode::kUnauthenticated, "not signed"));
  EXPECT_THAT(stores_[2]->TakeReplica(request, ""), StatusIs(absl::StatusCode::kUnauthenticated, "not signed"))
      << "a server that backs up nothing says so only to the primary";
  EXPECT_THAT(stores_[1]->TakeReplica(request, std::string(64, 'x')), unauthenticated);
  EXPECT_THAT(stores_[1]->TakeReplica(request, Signed(0, request, 2)), unauthenticated) << "signed for server 2";
  EXPECT_THAT(stores_[1]->TakeReplica(request, Signed(1, request, 1)), unauthenticated) << "signed by the backup";
  EXPECT_THAT(stores_[1]->TakeReplica(request, Signed(2, request, 1)), unauthenticated) << "signed by server 2";
  EXPECT_THAT(stores_[1]->TakeReplica(request, keys_[0]->Credential(keys_[1]->public_key(), 1, 2, request)),
              unauthenticated) << "made for another incarnation of server 1";
  const std::string genuine = Signed(0, request, 1);
  ASSERT_EQ(genuine.size(), kReplicaCredentialBytes);
  EXPECT_NE(genuine.substr(0, 12), Signed(0, request, 1).substr(0, 12)) << "a nonce used twice";
  for (size_t byte : {size_t{0}, size_t{11}, size_t{12}, kReplicaCredentialBytes - 1}) {
    std::string flipped = genuine;
    flipped[byte] = static_cast<char>(flipped[byte] ^ 1);
    EXPECT_THAT(stores_[1]->TakeReplica(request, flipped), unauthenticated) << "byte " << byte << " changed";
  }
  tessera::v1::ReplicateRequest changed = request;
  changed.mutable_state()->set_version(4);
  EXPECT_THAT(stores_[1]->TakeReplica(changed, genuine), unauthenticated) << "changed after signing";
  changed = request;
  (*changed.mutable_state()->mutable_last_seq())[0] = 7;
  EXPECT_THAT(stores_[1]->TakeReplica(changed, genuine), unauthenticated) << "a sequence number added";
  EXPECT_EQ(State(0).version(), 0) << "nothing was pushed";
  absl::StatusOr<int64_t> held = stores_[1]->TakeReplica(request, genuine);
  ASSERT_THAT(held, IsOk());
  EXPECT_EQ(*held, 3);
  // A view without the primary's replication key takes nothing from it.
  for (auto& server : *map_.mutable_servers()) server.clear_replication_key();
  map_.set_epoch(map_.epoch() + 1);
  ASSERT_THAT(stores_[1]->Assign(map_, job_, 1), IsOk());
  request.set_epoch(map_.epoch());
  EXPECT_THAT(stores_[1]->TakeReplica(request, Signed(0, request, 1)),
              StatusIs(absl::StatusCode::kUnauthenticated, "no replication key"));
}

// The epoch is the scheduler's: a signed state from a newer epoch is ABORTED and changes nothing, so the backup
// goes on taking its primary's states, and every acknowledged update survives the primary's loss.
TEST_F(ReplicationTest, AStateFromAFutureEpochIsNeverTakenAndAcknowledgedUpdatesSurvive) {
  Start(tessera::v1::ConsistencySpec::ASYNC, 1);
  uint64_t seq = 0;
  auto push = [&] {
    const int64_t clock = static_cast<int64_t>(seq++);
    auto answer = Push(0, Gradient(0, seq, clock, {0.5f, -0.25f, 1.0f}));
    ASSERT_TRUE(answer->has_value());
    ASSERT_THAT(**answer, IsOk());
  };
  for (int i = 0; i < 5; ++i) push();
  for (uint64_t ahead : {map_.epoch() + 1, map_.epoch() + 1000, kMaxEpoch}) {
    tessera::v1::ReplicateRequest future;
    future.set_epoch(ahead);
    future.set_server_id(0);
    *future.mutable_state() = State(0);  // the primary's own state: only its epoch is from the future
    EXPECT_THAT(stores_[1]->TakeReplica(future, Signed(0, future, 1)), StatusIs(absl::StatusCode::kAborted, "epoch"))
        << "epoch " << ahead;
  }
  push();
  const tessera::v1::ChunkState before = State(0);
  ASSERT_EQ(before.version(), 6);
  FailOver();
  const tessera::v1::ChunkState after = State(1);
  EXPECT_EQ(after.version(), 6) << "the promoted backup lost acknowledged updates";
  EXPECT_EQ(after.values(), before.values());
}

// Every number a Replicate carries is bounded (common/model/wire_limits.h) before anything is taken, even with a valid
// signature: each field at 0, the bound, past it, 2^63-1 and 2^64-1 (or their signed counterparts).
TEST_F(ReplicationTest, EveryNumberOfAReplicateIsBounded) {
  Start(tessera::v1::ConsistencySpec::ASYNC, 2);
  tessera::v1::ReplicateRequest base;
  base.set_epoch(map_.epoch());
  base.set_server_id(0);
  *base.mutable_state() = State(0);
  using Mutation = std::function<void(tessera::v1::ReplicateRequest&)>;
  constexpr int64_t kI63 = INT64_MAX;
  constexpr uint64_t kU64 = ~uint64_t{0};
  auto state = [](tessera::v1::ReplicateRequest& r) { return r.mutable_state(); };
  auto one_update = [](tessera::v1::ReplicateRequest& r, int64_t clock, float scale) {
    auto* u = r.add_updates();
    u->set_version(r.state().version());
    u->set_values(std::string(3 * sizeof(float), '\0'));
    u->set_clock(clock);
    u->set_lr_scale(scale);
    u->set_grad_scale(1.0f);
    r.mutable_state()->clear_values();
    r.mutable_state()->clear_optimizer_state();
  };
  const std::vector<std::pair<std::string, Mutation>> refused = {
      {"epoch past the bound", [](auto& r) { r.set_epoch(kMaxEpoch + 1); }},
      {"epoch 2^63-1", [](auto& r) { r.set_epoch(uint64_t{kI63}); }},
      {"epoch 2^64-1", [](auto& r) { r.set_epoch(kU64); }},
      {"server -1", [](auto& r) { r.set_server_id(-1); }},
      {"server past the job", [](auto& r) { r.set_server_id(kServers); }},
      {"version -1", [&](auto& r) { state(r)->set_version(-1); }},
      {"version past the bound", [&](auto& r) { state(r)->set_version(kMaxUpdateCount + 1); }},
      {"version 2^63-1", [&](auto& r) { state(r)->set_version(kI63); }},
      {"version -2^63", [&](auto& r) { state(r)->set_version(INT64_MIN); }},
      {"updates -1", [&](auto& r) { state(r)->set_gradient_updates(-1); }},
      {"updates past the version", [&](auto& r) { state(r)->set_gradient_updates(state(r)->version() + 1); }},
      {"updates 2^63-1", [&](auto& r) { state(r)->set_gradient_updates(kI63); }},
      {"assignments -1", [&](auto& r) { state(r)->set_assignments(-1); }},
      {"assignments past the version", [&](auto& r) { state(r)->set_assignments(state(r)->version() + 1); }},
      {"assignments 2^63-1", [&](auto& r) { state(r)->set_assignments(kI63); }},
      {"clock -1", [&](auto& r) { state(r)->set_applied_clocks(0, -1); }},
      {"clock past the bound", [&](auto& r) { state(r)->set_applied_clocks(0, kMaxClock + 1); }},
      {"clock 2^63-1", [&](auto& r) { state(r)->set_applied_clocks(1, kI63); }},
      {"a clock per worker more", [&](auto& r) { state(r)->add_applied_clocks(0); }},
      {"seq 0", [&](auto& r) { (*state(r)->mutable_last_seq())[0] = 0; }},
      {"seq past the bound", [&](auto& r) { (*state(r)->mutable_last_seq())[0] = uint64_t{kMaxUpdateCount} + 1; }},
      {"seq 2^63-1", [&](auto& r) { (*state(r)->mutable_last_seq())[1] = uint64_t{kI63}; }},
      {"seq 2^64-1", [&](auto& r) { (*state(r)->mutable_last_seq())[0] = kU64; }},
      {"seq of worker -1", [&](auto& r) { (*state(r)->mutable_last_seq())[-1] = 1; }},
      {"seq of a worker past the job", [&](auto& r) { (*state(r)->mutable_last_seq())[2] = 1; }},
      {"update clock -1", [&](auto& r) { state(r)->set_version(1); one_update(r, -1, 1.0f); }},
      {"update clock past the bound", [&](auto& r) { state(r)->set_version(1); one_update(r, kMaxClock + 1, 1.0f); }},
      {"update clock 2^63-1", [&](auto& r) { state(r)->set_version(1); one_update(r, kI63, 1.0f); }},
      {"update scale NaN", [&](auto& r) { state(r)->set_version(1); one_update(r, 0, std::nanf("")); }},
      {"update not ending at the state's version",
       [&](auto& r) { state(r)->set_version(1); one_update(r, 0, 1.0f); r.mutable_updates(0)->set_version(5); }},
  };
  for (const auto& [what, mutate] : refused) {
    tessera::v1::ReplicateRequest r = base;
    mutate(r);
    EXPECT_THAT(stores_[1]->TakeReplica(r, Signed(0, r, 1)), StatusIs(absl::StatusCode::kInvalidArgument, ""))
        << what;
  }
  EXPECT_EQ(State(0).version(), 0);
  // At the bounds a state is taken.
  tessera::v1::ReplicateRequest at_bounds = base;
  at_bounds.mutable_state()->set_version(kMaxUpdateCount);
  at_bounds.mutable_state()->set_gradient_updates(kMaxUpdateCount);
  at_bounds.mutable_state()->set_applied_clocks(0, kMaxClock);
  (*at_bounds.mutable_state()->mutable_last_seq())[1] = uint64_t{kMaxUpdateCount};
  absl::StatusOr<int64_t> held = stores_[1]->TakeReplica(at_bounds, Signed(0, at_bounds, 1));
  ASSERT_THAT(held, IsOk());
  EXPECT_EQ(*held, kMaxUpdateCount);
}

// A push's sequence number is bounded too: 2^64-1 can no longer make every later push of a worker a duplicate.
TEST_F(ReplicationTest, APushSequenceNumberPastItsBoundIsRefused) {
  Start(tessera::v1::ConsistencySpec::ASYNC, 1);
  for (uint64_t seq : {uint64_t{0}, uint64_t{kMaxUpdateCount} + 1, uint64_t{INT64_MAX}, ~uint64_t{0}}) {
    auto answer = Push(0, Gradient(0, seq, 0, {1, 1, 1}));
    ASSERT_TRUE(answer->has_value());
    EXPECT_THAT(**answer, StatusIs(absl::StatusCode::kInvalidArgument, "seq")) << seq;
  }
  auto last = Push(0, Gradient(0, uint64_t{kMaxUpdateCount}, 0, {1, 1, 1}));
  ASSERT_TRUE(last->has_value());
  ASSERT_THAT(**last, IsOk());
  EXPECT_FALSE((**last)->duplicate);
}

// A primary counts a hand-over as held only when the backup says it holds the version sent: a push stays
// unanswered while the backup answers with another version, and is answered once it answers with that one.
TEST_F(ReplicationTest, AHandOverCountsOnlyAtTheVersionTheBackupSaysItHolds) {
  Start(tessera::v1::ConsistencySpec::ASYNC, 1);
  auto first = Push(0, Gradient(0, 1, 0, {1, 1, 1}));
  ASSERT_TRUE(first->has_value());
  ASSERT_THAT(**first, IsOk());
  for (int64_t offset : {int64_t{-1}, int64_t{1}}) {
    senders_[0]->set_answer_offset(offset);
    absl::Notification answered;
    stores_[0]->Push(Gradient(0, offset == -1 ? 2 : 3, offset == -1 ? 1 : 2, {1, 1, 1}).push,
                     SpanPayload(std::vector<float>{1, 1, 1}), [&answered](absl::StatusOr<PushOutcome> outcome) {
                       EXPECT_THAT(outcome, IsOk());
                       answered.Notify();
                     });
    EXPECT_FALSE(answered.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
        << "answered while the backup said it holds another version (offset " << offset << ")";
    senders_[0]->set_answer_offset(0);
    EXPECT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)))
        << "not answered once the backup holds the version sent";
  }
}

// SYNC rounds that close without an update (a worker skipped its step) reach the backup as updates of their own:
// it holds every round bit for bit, the skipped ones included, and goes on from the same version.
TEST_F(ReplicationTest, SkippedAndScaledSyncRoundsReachTheBackupBitForBit) {
  Start(tessera::v1::ConsistencySpec::SYNC, 2);
  uint64_t seq[2] = {0, 0};
  for (int round = 0; round < 12; ++round) {
    std::vector<std::shared_ptr<std::optional<absl::StatusOr<ChunkValues>>>> answers;
    for (int w = 0; w < 2; ++w) {
      const float g = 0.37f * static_cast<float>(round + 1) / static_cast<float>(w + 3);
      Sent sent = Gradient(w, ++seq[w], round, {g, -g, g * g});
      sent.push.skip = round % 3 == 1 && w == 1;
      sent.push.lr_factor = 1.0f / static_cast<float>(round + 1);
      answers.push_back(Exchange(0, sent));
    }
    for (const auto& a : answers) {
      ASSERT_TRUE(a->has_value()) << "round " << round;
      ASSERT_THAT(**a, IsOk());
      EXPECT_EQ((**a)->skipped, round % 3 == 1) << "round " << round;
    }
  }
  const tessera::v1::ChunkState before = State(0);
  EXPECT_EQ(before.version(), 12);
  EXPECT_EQ(before.gradient_updates(), 8) << "the 4 skipped rounds took no optimizer step";
  FailOver();
  const tessera::v1::ChunkState after = State(1);
  EXPECT_EQ(after.version(), before.version());
  EXPECT_EQ(after.gradient_updates(), before.gradient_updates());
  EXPECT_EQ(after.values(), before.values()) << "values differ in their bits";
  EXPECT_EQ(after.optimizer_state(), before.optimizer_state()) << "momentum differs";
}

}  // namespace
}  // namespace tessera
