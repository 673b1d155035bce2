#include "scheduler/membership/cluster_view.h"

#include <map>


#include "absl/strings/str_cat.h"
#include "common/rpc/security.h"
#include "common/model/wire_limits.h"
#include "gtest/gtest.h"
#include "tests/testing/param_spec.h"
#include "tests/testing/registrations.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::FloatParam;
using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

using ::tessera::testing::AtZero;
using ::tessera::testing::JoinAnswered;

tessera::v1::RegisterRequest Server(const std::string& address, int id = -1) {
  return ::tessera::testing::ServerRegistration(address, id);
}
tessera::v1::RegisterRequest Worker(const std::string& host, int rank = -1) {
  return ::tessera::testing::WorkerRegistration(host, rank);
}

// Places `params` and commits the plan, as the coordinator does once every server holds it.
absl::Status PlaceAndCommit(ClusterView& view, const std::vector<tessera::v1::ParameterSpec>& params,
                            int64_t chunk_bytes) {
  absl::StatusOr<ClusterView::Placed> placed = view.Place(params, chunk_bytes);
  if (!placed.ok()) return placed.status();
  return view.Commit(*placed);
}

TEST(ClusterViewTest, WaitingSummaryNamesWhoIsMissingAndWhenEachMemberWasLastHeard) {
  ClusterView view(/*num_servers=*/2, /*num_workers=*/2);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_EQ(view.WaitingSummary(t0, absl::Seconds(10)), "waiting for 2 more servers and 2 more workers");
  ASSERT_THAT(JoinAnswered(view, Server("node7:4100"), t0, AtZero).status(), IsOk());
  ASSERT_THAT(JoinAnswered(view, Worker("gpu3"), t0 + absl::Seconds(30), AtZero).status(), IsOk());
  EXPECT_EQ(view.WaitingSummary(t0 + absl::Seconds(34), absl::Seconds(10)),
            "waiting for 1 more server and 1 more worker; server 0 at node7:4100 lost, last heard 34 s ago; "
            "worker 0 on gpu3 last heard 4 s ago");
  ASSERT_THAT(view.Touch(tessera::v1::SERVER, 0, 1, t0 + absl::Seconds(33)), IsOk());
  EXPECT_NE(view.WaitingSummary(t0 + absl::Seconds(34), absl::Seconds(10)).find("server 0 at node7:4100 last heard 1 s ago"),
            std::string::npos);
  ASSERT_THAT(JoinAnswered(view, Server("node8:4100"), t0, AtZero).status(), IsOk());
  ASSERT_THAT(JoinAnswered(view, Worker("gpu4"), t0, AtZero).status(), IsOk());
  EXPECT_EQ(view.WaitingSummary(t0, absl::Seconds(10)), "") << "nobody is missing";
}

// The scenario a new user met: a server dies before the job starts. The view says so, the replacement takes its
// place (a new incarnation of the same id), a second replacement finds no place, and the epoch moves.
// A member is not lost while its registration waits to be answered (the servers taking the view with its key
// first, one of them frozen): its silence counts from the answer.
TEST(ClusterViewTest, AMemberIsNotLostBeforeItsRegistrationIsAnswered) {
  ClusterView view(/*num_servers=*/1, /*num_workers=*/1);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_THAT(JoinAnswered(view, Server("a:1"), t0, AtZero).status(), IsOk());
  absl::StatusOr<ClusterView::Joined> worker = view.Join(Worker("h0"), t0, AtZero);
  ASSERT_THAT(worker.status(), IsOk());
  EXPECT_TRUE(view.MarkSilentLost(t0 + absl::Seconds(30), absl::Seconds(10)).size() == 1u) << "only server 0";
  EXPECT_EQ(view.Workers()[0].state, MemberState::kAlive);
  view.Answered(tessera::v1::WORKER, 0, worker->member.incarnation, t0 + absl::Seconds(30));
  EXPECT_TRUE(view.MarkSilentLost(t0 + absl::Seconds(39), absl::Seconds(10)).empty());
  std::vector<Member> lost = view.MarkSilentLost(t0 + absl::Seconds(41), absl::Seconds(10));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].role, tessera::v1::WORKER);
  // An answer for an incarnation that no longer holds the slot changes nothing.
  view.Answered(tessera::v1::WORKER, 0, worker->member.incarnation + 1, t0 + absl::Seconds(50));
  EXPECT_EQ(view.Workers()[0].state, MemberState::kLost);
}

TEST(ClusterViewTest, AReplacementTakesTheLostServersPlace) {
  ClusterView view(2, 1);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_THAT(JoinAnswered(view, Server("a:1"), t0, AtZero).status(), IsOk());
  ASSERT_THAT(JoinAnswered(view, Server("b:1"), t0 + absl::Seconds(20), AtZero).status(), IsOk());
  const uint64_t before = view.epoch();
  std::vector<Member> lost = view.MarkSilentLost(t0 + absl::Seconds(21), absl::Seconds(10));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].Describe(), "server 0 at a:1");
  EXPECT_EQ(view.epoch(), before) << "nothing is placed, so nobody holds a view yet";
  EXPECT_NE(view.WaitingSummary(t0 + absl::Seconds(25), absl::Seconds(10)).find("waiting for 1 more server"),
            std::string::npos);
  EXPECT_THAT(view.Touch(tessera::v1::SERVER, 0, 1, t0 + absl::Seconds(22)),
              StatusIs(absl::StatusCode::kFailedPrecondition, "declared lost"));
  EXPECT_THAT(view.Place({FloatParam("w", 10)}, 16).status(), StatusIs(absl::StatusCode::kUnavailable, "server 0 at a:1 (lost)"));

  absl::StatusOr<ClusterView::Joined> replacement = JoinAnswered(view, Server("c:1"), t0 + absl::Seconds(23), AtZero);
  ASSERT_THAT(replacement, IsOk());
  EXPECT_EQ(replacement->member.id, 0);
  EXPECT_EQ(replacement->member.incarnation, 2u);
  EXPECT_EQ(replacement->was, MemberState::kLost);
  EXPECT_THAT(JoinAnswered(view, Server("d:1"), t0, AtZero).status(), StatusIs(absl::StatusCode::kResourceExhausted, "all its"));
  absl::StatusOr<ClusterView::Placed> placed = view.Place({FloatParam("w", 10)}, 16);
  ASSERT_THAT(placed, IsOk());
  ASSERT_EQ(placed->map.servers_size(), 2);
  EXPECT_EQ(placed->map.servers(0).address(), "c:1");
  EXPECT_EQ(placed->map.servers(0).incarnation(), 2u);
}

// A worker rank that is lost leaves the rounds (inactive in the view, epoch advanced); a new process asking for
// the rank gets it with the next incarnation, and so does one asking while the old process is still registered.
TEST(ClusterViewTest, WorkersRejoinWithANewIncarnation) {
  ClusterView view(1, 2);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_THAT(JoinAnswered(view, Server("a:1"), t0, AtZero).status(), IsOk());
  ASSERT_THAT(JoinAnswered(view, Worker("h0"), t0, AtZero).status(), IsOk());
  ASSERT_THAT(JoinAnswered(view, Worker("h1"), t0 + absl::Seconds(30), AtZero).status(), IsOk());
  ASSERT_THAT(PlaceAndCommit(view, {FloatParam("w", 10)}, 16), IsOk());
  const uint64_t placed_epoch = view.epoch();
  ASSERT_EQ(view.MarkSilentLost(t0 + absl::Seconds(31), absl::Seconds(10)).size(), 2u) << "server 0 and worker 0";
  EXPECT_GT(view.epoch(), placed_epoch);
  std::optional<tessera::v1::ShardMap> map = view.Map();
  ASSERT_TRUE(map.has_value());
  EXPECT_FALSE(map->workers(0).active());
  EXPECT_TRUE(map->workers(1).active());
  EXPECT_EQ(map->servers_size(), 0) << "the lost server is out of the view";

  // No rank asked for: the lost rank is the one free.
  absl::StatusOr<ClusterView::Joined> back = JoinAnswered(view, Worker("h0"), t0 + absl::Seconds(32), [](const Member& slot) {
    EXPECT_EQ(slot.incarnation, 1u);
    return int64_t{7};
  });
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->member.id, 0);
  EXPECT_EQ(back->member.incarnation, 2u);
  EXPECT_EQ(back->member.joined_clock, 7);
  map = view.Map();
  EXPECT_TRUE(map->workers(0).active());
  EXPECT_EQ(map->workers(0).joined_clock(), 7);

  // Rank 1 asked for while its holder is alive: the old incarnation is replaced.
  absl::StatusOr<ClusterView::Joined> restarted = JoinAnswered(view, Worker("h1", /*rank=*/1), t0 + absl::Seconds(33), AtZero);
  ASSERT_THAT(restarted, IsOk());
  EXPECT_EQ(restarted->member.incarnation, 2u);
  EXPECT_EQ(restarted->was, MemberState::kAlive);
  EXPECT_THAT(view.Touch(tessera::v1::WORKER, 1, 1, t0 + absl::Seconds(33)),
              StatusIs(absl::StatusCode::kFailedPrecondition, "replaced by incarnation 2"));
  EXPECT_THAT(JoinAnswered(view, Worker("h2"), t0, AtZero).status(), StatusIs(absl::StatusCode::kResourceExhausted, "all its"));
  EXPECT_THAT(JoinAnswered(view, Worker("h2", 5), t0, AtZero).status(), StatusIs(absl::StatusCode::kInvalidArgument, "id 5"));
}

TEST(ClusterViewTest, ALostServersChunksMoveToTheLeastLoadedSurvivors) {
  ClusterView view(3, 1);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (const char* a : {"a:1", "b:1", "c:1"}) ASSERT_THAT(JoinAnswered(view, Server(a), t0, AtZero).status(), IsOk());
  ASSERT_THAT(PlaceAndCommit(view, {FloatParam("w", 60), FloatParam("b", 6)}, 40), IsOk());
  ASSERT_THAT(view.Touch(tessera::v1::SERVER, 0, 1, t0 + absl::Seconds(20)), IsOk());
  ASSERT_THAT(view.Touch(tessera::v1::SERVER, 2, 1, t0 + absl::Seconds(20)), IsOk());
  ASSERT_EQ(view.MarkSilentLost(t0 + absl::Seconds(20), absl::Seconds(10)).size(), 1u);
  const uint64_t before = view.epoch();
  absl::StatusOr<ChunkMoves> moved = view.MoveChunksOf(1);
  ASSERT_THAT(moved, IsOk());
  EXPECT_FALSE(moved->moved.empty());
  EXPECT_TRUE(moved->promoted.empty()) << "no backups in this job";
  EXPECT_GT(view.epoch(), before);
  std::optional<tessera::v1::ShardMap> map = view.Map();
  for (const auto& c : map->chunks()) EXPECT_NE(c.server_id(), 1) << c.param() << "/" << c.index();
  int64_t bytes0 = 0, bytes2 = 0;
  for (const auto& c : map->chunks()) (c.server_id() == 0 ? bytes0 : bytes2) += c.length() * 4;
  EXPECT_LE(std::abs(bytes0 - bytes2), 40) << "within one chunk of each other";
}

// With backups, every chunk has its copies on distinct servers; a lost primary's chunks go to their backups (no
// chunk needs a restore), the lost server leaves every backup list, and the chunks short of a backup get one on
// the servers left.
TEST(ClusterViewTest, WithBackupsALostPrimarysChunksGoToTheirBackupsAndGetNewOnes) {
  ClusterView view(3, 1, /*backups=*/1);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (const char* a : {"a:1", "b:1", "c:1"}) ASSERT_THAT(JoinAnswered(view, Server(a), t0, AtZero).status(), IsOk());
  ASSERT_THAT(PlaceAndCommit(view, {FloatParam("w", 60), FloatParam("b", 6)}, 40), IsOk());
  std::optional<tessera::v1::ShardMap> before = view.Map();
  std::map<std::pair<std::string, int>, int> backup_of;
  for (const auto& c : before->chunks()) {
    ASSERT_EQ(c.backup_server_ids_size(), 1) << c.param() << "/" << c.index();
    EXPECT_NE(c.backup_server_ids(0), c.server_id()) << "two copies on one server";
    backup_of[{c.param(), c.index()}] = c.backup_server_ids(0);
  }
  ASSERT_THAT(view.Touch(tessera::v1::SERVER, 0, 1, t0 + absl::Seconds(20)), IsOk());
  ASSERT_THAT(view.Touch(tessera::v1::SERVER, 2, 1, t0 + absl::Seconds(20)), IsOk());
  ASSERT_EQ(view.MarkSilentLost(t0 + absl::Seconds(20), absl::Seconds(10)).size(), 1u);
  absl::StatusOr<ChunkMoves> moves = view.MoveChunksOf(1);
  ASSERT_THAT(moves, IsOk());
  EXPECT_TRUE(moves->moved.empty()) << "every chunk had a backup";
  EXPECT_FALSE(moves->promoted.empty());
  std::optional<tessera::v1::ShardMap> after = view.Map();
  for (const auto& c : after->chunks()) {
    const std::string name = absl::StrCat(c.param(), "/", c.index());
    EXPECT_NE(c.server_id(), 1) << name;
    ASSERT_EQ(c.backup_server_ids_size(), 1) << name << ": a new backup on the servers left";
    EXPECT_NE(c.backup_server_ids(0), 1) << name;
    EXPECT_NE(c.backup_server_ids(0), c.server_id()) << name;
  }
  for (const auto& p : moves->promoted) {
    EXPECT_EQ(p.server_id(), (backup_of[{p.param(), p.index()}])) << "the backup took over " << p.param();
  }
}

TEST(ClusterViewTest, WithBackupsAReplacementBacksUpTheChunksShortOfBackups) {
  ClusterView view(2, 1, /*backups=*/1);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (const char* a : {"a:1", "b:1"}) ASSERT_THAT(JoinAnswered(view, Server(a), t0, AtZero).status(), IsOk());
  ASSERT_THAT(PlaceAndCommit(view, {FloatParam("w", 60)}, 40), IsOk());
  ASSERT_THAT(view.Touch(tessera::v1::SERVER, 0, 1, t0 + absl::Seconds(20)), IsOk());
  ASSERT_EQ(view.MarkSilentLost(t0 + absl::Seconds(20), absl::Seconds(10)).size(), 1u);
  ASSERT_THAT(view.MoveChunksOf(1), IsOk());
  const tessera::v1::ShardMap alone = *view.Map();
  for (const auto& c : alone.chunks()) {
    EXPECT_EQ(c.server_id(), 0);
    EXPECT_EQ(c.backup_server_ids_size(), 0) << "one server left: no room for a backup";
  }
  ASSERT_THAT(JoinAnswered(view, Server("c:1", 1), t0 + absl::Seconds(21), AtZero).status(), IsOk());
  absl::StatusOr<std::vector<tessera::v1::ChunkPlacement>> given = view.GiveShareTo(1);
  ASSERT_THAT(given, IsOk());
  const tessera::v1::ShardMap after = *view.Map();
  EXPECT_EQ(given->size(), static_cast<size_t>(after.chunks_size()));
  for (const auto& c : after.chunks()) {
    EXPECT_EQ(c.server_id(), 0) << "primaries stay";
    ASSERT_EQ(c.backup_server_ids_size(), 1);
    EXPECT_EQ(c.backup_server_ids(0), 1);
  }
}

// A drain's moves take every copy off the server, each to a server without a copy; the two phases first add the
// destination as a backup, then take the chunk off the source; the drained server's slot can be taken again.
TEST(ClusterViewTest, ADrainMovesEveryCopyOffTheServerInTwoPhases) {
  ClusterView view(3, 1, /*backups=*/1);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (const char* a : {"a:1", "b:1", "c:1"}) ASSERT_THAT(JoinAnswered(view, Server(a), t0, AtZero).status(), IsOk());
  ASSERT_THAT(PlaceAndCommit(view, {FloatParam("w", 60), FloatParam("b", 6)}, 40), IsOk());
  absl::StatusOr<std::vector<ChunkMove>> moves = view.DrainMoves(1);
  ASSERT_THAT(moves, IsOk());
  ASSERT_FALSE(moves->empty());
  const uint64_t before = view.epoch();
  ASSERT_THAT(view.BeginMoves(*moves), IsOk());
  EXPECT_GT(view.epoch(), before);
  const tessera::v1::ShardMap copying = *view.Map();
  for (const auto& m : *moves) {
    for (const auto& c : copying.chunks()) {
      if (c.param() != m.param || c.index() != m.index) continue;
      EXPECT_NE(std::find(c.backup_server_ids().begin(), c.backup_server_ids().end(), m.to), c.backup_server_ids().end())
          << "phase 1: the destination is a backup of " << m.param << "/" << m.index;
    }
  }
  ASSERT_THAT(view.FinishMoves(*moves), IsOk());
  const tessera::v1::ShardMap after = *view.Map();
  for (const auto& c : after.chunks()) {
    EXPECT_NE(c.server_id(), 1) << c.param() << "/" << c.index();
    EXPECT_EQ(std::count(c.backup_server_ids().begin(), c.backup_server_ids().end(), 1), 0);
    EXPECT_EQ(c.backup_server_ids_size(), 1) << "still one backup";
    EXPECT_NE(c.backup_server_ids(0), c.server_id());
  }
  ASSERT_TRUE(view.MarkServerDrained(1));
  EXPECT_EQ(view.Map()->servers_size(), 2);
  absl::StatusOr<ClusterView::Joined> joined = JoinAnswered(view, Server("d:1"), t0 + absl::Seconds(1), AtZero);
  ASSERT_THAT(joined.status(), IsOk());
  EXPECT_EQ(joined->member.id, 1) << "the drained slot is taken again";
  EXPECT_FALSE(view.ShareMoves(1).empty()) << "the newcomer gets a share of the primaries";
}

// A phase 1 with one move that no longer fits (its destination was lost) is refused whole: the moves before it in
// the list are not made either, and the epoch stays.
TEST(ClusterViewTest, AMoveThatNoLongerFitsLeavesTheViewAsItWas) {
  ClusterView view(3, 1, /*backups=*/0);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (const char* a : {"a:1", "b:1", "c:1"}) ASSERT_THAT(JoinAnswered(view, Server(a), t0, AtZero).status(), IsOk());
  ASSERT_THAT(PlaceAndCommit(view, {FloatParam("w", 60), FloatParam("b", 6)}, 40), IsOk());
  absl::StatusOr<std::vector<ChunkMove>> moves = view.DrainMoves(0);
  ASSERT_THAT(moves, IsOk());
  ASSERT_GE(moves->size(), 1u);
  std::vector<ChunkMove> stale = *moves;
  stale.push_back({stale.front().param, stale.front().index, 0, 2});
  ASSERT_TRUE(view.MarkServerLost(2, 0, "test"));
  ASSERT_THAT(view.MoveChunksOf(2), IsOk());
  stale.erase(std::remove_if(stale.begin(), stale.end() - 1, [](const ChunkMove& m) { return m.to == 2; }),
              stale.end() - 1);
  const tessera::v1::ShardMap before = *view.Map();
  EXPECT_THAT(view.BeginMoves(stale), StatusIs(absl::StatusCode::kFailedPrecondition, "cannot move to server 2"));
  const tessera::v1::ShardMap after = *view.Map();
  EXPECT_EQ(after.epoch(), before.epoch());
  EXPECT_EQ(after.SerializeAsString(), before.SerializeAsString()) << "no move of the list was made";
}

// Every change of members or placement reaches each subscriber once, in the order made, after the change (a
// listener reading the view sees it), with what the parts that care need to know.
TEST(ClusterViewTest, EveryChangeIsPublishedToItsSubscribersOnceMade) {
  ClusterView view(2, 2);
  struct Heard {
    MembershipEvent::Kind kind;
    int id;
    uint64_t incarnation;
    MemberState state_in_view;  // what a listener reading the view saw
    std::string failure;
    size_t chunks;
  };
  std::vector<Heard> first, second;
  auto listen = [&view](std::vector<Heard>& into) {
    return [&view, &into](const MembershipEvent& e) {
      const std::vector<Member> slots = e.member.role == tessera::v1::SERVER ? view.Servers() : view.Workers();
      const MemberState state = e.member.id >= 0 ? slots[e.member.id].state : MemberState::kVacant;
      into.push_back({e.kind, e.member.id, e.member.incarnation, state, e.failure, e.chunks.size()});
    };
  };
  view.Subscribe(listen(first));
  view.Subscribe(listen(second));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_THAT(JoinAnswered(view, Server("a:1"), t0, AtZero).status(), IsOk());
  ASSERT_THAT(JoinAnswered(view, Server("b:1"), t0, AtZero).status(), IsOk());
  ASSERT_THAT(JoinAnswered(view, Worker("h0"), t0, AtZero).status(), IsOk());
  ASSERT_THAT(JoinAnswered(view, Worker("h1"), t0, AtZero).status(), IsOk());
  ASSERT_THAT(PlaceAndCommit(view, {FloatParam("w", 60)}, 40), IsOk());
  ASSERT_TRUE(view.Leave(0, MemberState::kLost, "INTERNAL: out of memory"));
  ASSERT_THAT(JoinAnswered(view, Worker("h0", 0), t0, AtZero).status(), IsOk());
  ASSERT_TRUE(view.Leave(1, MemberState::kDone));
  ASSERT_THAT(view.Touch(tessera::v1::SERVER, 0, 1, t0 + absl::Seconds(20)), IsOk());
  ASSERT_THAT(view.Touch(tessera::v1::WORKER, 0, 2, t0 + absl::Seconds(20)), IsOk());
  ASSERT_EQ(view.MarkSilentLost(t0 + absl::Seconds(20), absl::Seconds(10)).size(), 1u);  // server 1
  ASSERT_THAT(view.MoveChunksOf(1), IsOk());
  view.RollBack(7);
  ASSERT_THAT(JoinAnswered(view, Server("c:1", 1), t0 + absl::Seconds(21), AtZero).status(), IsOk());
  const std::vector<ChunkMove> share = view.ShareMoves(1);
  ASSERT_FALSE(share.empty());
  ASSERT_THAT(view.BeginMoves(share), IsOk());
  ASSERT_THAT(view.FinishMoves(share), IsOk());

  using E = MembershipEvent;
  const std::vector<std::pair<E::Kind, int>> expected = {
      {E::kServerJoined, 0},   {E::kServerJoined, 1}, {E::kWorkerJoined, 0},   {E::kWorkerJoined, 1},
      {E::kWorkerLost, 0},     {E::kWorkerRejoined, 0}, {E::kWorkerDone, 1},   {E::kServerLost, 1},
      {E::kChunksMoved, 1},    {E::kRolledBack, -1},  {E::kServerReplaced, 1}, {E::kChunksMoved, 1}};
  ASSERT_EQ(first.size(), expected.size());
  ASSERT_EQ(second.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(first[i].kind, expected[i].first) << "event " << i << ": " << MembershipEventName(first[i].kind);
    EXPECT_EQ(first[i].id, expected[i].second) << "event " << i;
    EXPECT_EQ(second[i].kind, first[i].kind) << "event " << i;
  }
  EXPECT_EQ(first[4].failure, "INTERNAL: out of memory");
  EXPECT_EQ(first[4].state_in_view, MemberState::kLost) << "published after the change";
  EXPECT_EQ(first[5].incarnation, 2u);
  EXPECT_EQ(first[5].state_in_view, MemberState::kAlive);
  EXPECT_EQ(first[6].state_in_view, MemberState::kDone);
  EXPECT_EQ(first[7].state_in_view, MemberState::kLost);
  EXPECT_GT(first[8].chunks, 0u);
  EXPECT_EQ(first[10].incarnation, 2u);
  EXPECT_GT(first[11].chunks, 0u);
}

// A placement is a plan until the servers hold it: until Commit the job stays unplaced (so a lost server waits
// for its replacement), a new plan never reuses a plan's epoch, and a plan made before the members changed is
// refused at commit.
TEST(ClusterViewTest, APlacementExistsOnlyOnceCommitted) {
  ClusterView view(2, 1);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (const char* a : {"a:1", "b:1"}) ASSERT_THAT(JoinAnswered(view, Server(a), t0, AtZero).status(), IsOk());
  absl::StatusOr<ClusterView::Placed> first = view.Place({FloatParam("w", 10)}, 16);
  ASSERT_THAT(first, IsOk());
  EXPECT_TRUE(first->changed);
  EXPECT_FALSE(view.placed()) << "a plan the servers may not hold is not a placement";
  EXPECT_FALSE(view.Map().has_value());
  // The hand-over failed; the worker declares again: a new plan, with a newer epoch.
  absl::StatusOr<ClusterView::Placed> second = view.Place({FloatParam("w", 10)}, 16);
  ASSERT_THAT(second, IsOk());
  EXPECT_TRUE(second->changed);
  EXPECT_GT(second->map.epoch(), first->map.epoch());
  // A member changed meanwhile (server 1 replaced): the plan is refused, and placing again works.
  ASSERT_THAT(JoinAnswered(view, Server("c:1", 1), t0 + absl::Seconds(1), AtZero).status(), IsOk());
  EXPECT_THAT(view.Commit(*second), StatusIs(absl::StatusCode::kAborted, "placing again"));
  EXPECT_FALSE(view.placed());
  absl::StatusOr<ClusterView::Placed> third = view.Place({FloatParam("w", 10)}, 16);
  ASSERT_THAT(third, IsOk());
  ASSERT_THAT(view.Commit(*third), IsOk());
  EXPECT_TRUE(view.placed());
  ASSERT_TRUE(view.Map().has_value());
  EXPECT_EQ(view.Map()->epoch(), third->map.epoch());
  EXPECT_EQ(view.Map()->servers(1).address(), "c:1");
  absl::StatusOr<ClusterView::Placed> again = view.Place({FloatParam("w", 10)}, 16);
  ASSERT_THAT(again, IsOk());
  EXPECT_FALSE(again->changed) << "the same parameters again: the committed placement";
}

// Every slot taken: a registrant without an id waits (UNAVAILABLE, naming whom) while a member has been silent
// past `suspect_after` or sits on its own host, and takes that slot once it is declared lost; with every member
// answering from elsewhere it is told at once there is no place, and which flag takes one.
TEST(ClusterViewTest, ARestartedMemberWithoutItsIdWaitsForTheSlotOfOneThatStoppedAnswering) {
  for (const bool server : {false, true}) {
    ClusterView view(2, 2);
    const absl::Time t0 = absl::FromUnixSeconds(1000);
    auto member = [&](const std::string& host) {
      tessera::v1::RegisterRequest r = server ? Server(host + ":1") : Worker(host);
      r.set_hostname(host);
      return r;
    };
    for (const char* h : {"h0", "h1"}) ASSERT_THAT(JoinAnswered(view, member(h), t0, AtZero).status(), IsOk());
    const absl::Duration suspect_after = absl::Seconds(1);
    EXPECT_THAT(JoinAnswered(view, member("h9"), t0 + absl::Milliseconds(500), AtZero, suspect_after).status(),
                StatusIs(absl::StatusCode::kResourceExhausted, server ? "--id" : "--rank"));
    // Restarted on its own host: waits at once.
    EXPECT_THAT(JoinAnswered(view, member("h1"), t0 + absl::Milliseconds(500), AtZero, suspect_after).status(),
                StatusIs(absl::StatusCode::kUnavailable, "was last heard"));
    // From elsewhere: waits once a member has been silent past suspect_after.
    ASSERT_THAT(view.Touch(server ? tessera::v1::SERVER : tessera::v1::WORKER, 0, 1, t0 + absl::Seconds(2)),
                IsOk());
    EXPECT_THAT(JoinAnswered(view, member("h9"), t0 + absl::Seconds(2), AtZero, suspect_after).status(),
                StatusIs(absl::StatusCode::kUnavailable, absl::StrCat(server ? "--id" : "--rank", "=1")));
    ASSERT_EQ(view.MarkSilentLost(t0 + absl::Seconds(11), absl::Seconds(10)).size(), 1u);
    absl::StatusOr<ClusterView::Joined> back = JoinAnswered(view, member("h1"), t0 + absl::Seconds(11), AtZero, suspect_after);
    ASSERT_THAT(back, IsOk());
    EXPECT_EQ(back->member.id, 1);
    EXPECT_EQ(back->member.incarnation, 2u);
  }
}

// A restarted scheduler's slot rules for what members bring back (ClusterView::Return): an awaited slot goes to
// the key its view holds only, whatever incarnation a caller names; every incarnation and clock is bounded.
TEST(ClusterViewTest, AnAwaitedSlotGoesOnlyToItsKeyAndEveryNumberBroughtBackIsBounded) {
  ClusterView view(1, 2);
  const std::string key = "the-real-workers-key";
  tessera::v1::ShardMap taken;
  taken.set_epoch(7);
  *taken.add_params() = FloatParam("w", 4);
  auto* chunk = taken.add_chunks();
  chunk->set_param("w");
  chunk->set_length(4);
  auto* s = taken.add_servers();
  s->set_id(0);
  s->set_address("s0:1");
  s->set_incarnation(1);
  s->set_key_digest(KeyDigest("server-key"));
  auto* w = taken.add_workers();
  w->set_id(0);
  w->set_incarnation(3);
  w->set_active(true);
  w->set_key_digest(KeyDigest(key));
  view.Adopt(taken, absl::Now());
  auto back = [&](uint64_t incarnation, int64_t clock, const std::string& with) {
    tessera::v1::RegisterRequest r = Worker("h", 0);
    r.mutable_rejoin()->set_job("j");
    r.mutable_rejoin()->set_incarnation(incarnation);
    r.mutable_rejoin()->set_clock(clock);
    return view.Return(r, with, absl::Now());
  };
  for (uint64_t incarnation : {uint64_t{0}, kMaxIncarnation + 1, uint64_t{1} << 63, ~uint64_t{0}}) {
    EXPECT_THAT(back(incarnation, 0, "forged"), StatusIs(absl::StatusCode::kInvalidArgument, "incarnation"))
        << incarnation;
    EXPECT_THAT(back(incarnation, 0, key), StatusIs(absl::StatusCode::kInvalidArgument, "incarnation"))
        << incarnation;
  }
  for (int64_t clock : {int64_t{-1}, kMaxClock + 1, INT64_MAX, INT64_MIN}) {
    EXPECT_THAT(back(3, clock, key), StatusIs(absl::StatusCode::kInvalidArgument, "clock")) << clock;
  }
  for (uint64_t incarnation : {uint64_t{3}, uint64_t{4}, kMaxIncarnation}) {
    EXPECT_THAT(back(incarnation, 0, "forged"), StatusIs(absl::StatusCode::kUnauthenticated, "")) << incarnation;
    EXPECT_THAT(back(incarnation, 0, ""), StatusIs(absl::StatusCode::kUnauthenticated, "")) << incarnation;
  }
  EXPECT_THAT(back(2, 0, key), StatusIs(absl::StatusCode::kFailedPrecondition, "replaced"));
  EXPECT_THAT(back(4, 0, key), StatusIs(absl::StatusCode::kInvalidArgument, "incarnation 3"));
  EXPECT_TRUE(view.Workers()[0].awaited) << "nothing above took the slot";
  absl::StatusOr<Member> real = back(3, kMaxClock, key);
  ASSERT_THAT(real, IsOk());
  EXPECT_EQ(real->incarnation, 3u);
  EXPECT_THAT(view.CheckMemberKey(tessera::v1::WORKER, 0, key), IsOk());
}

// An incarnation never wraps: a rank at the bound (taken back that way) takes no new process.
TEST(ClusterViewTest, IncarnationsStopAtTheirBoundInsteadOfWrapping) {
  ClusterView view(1, 1);
  view.Adopt(tessera::v1::ShardMap(), absl::Now());  // nothing placed: the rank is vacant
  tessera::v1::RegisterRequest r = Worker("h", 0);
  r.mutable_rejoin()->set_job("j");
  r.mutable_rejoin()->set_incarnation(kMaxIncarnation);
  ASSERT_THAT(view.Return(r, "some-key", absl::Now()), IsOk());
  EXPECT_THAT(JoinAnswered(view, Worker("h", 0), absl::Now(), AtZero),
              StatusIs(absl::StatusCode::kResourceExhausted, "incarnations"));
  EXPECT_EQ(view.Workers()[0].incarnation, kMaxIncarnation);
}

// With backups, a server registers its replication key (its backups check its hand-overs with it), of 32 bytes;
// a worker has none. The view carries it.
TEST(ClusterViewTest, ServersOfAJobWithBackupsRegisterTheirReplicationKey) {
  ClusterView view(2, 1, /*backups=*/1);
  tessera::v1::RegisterRequest without = Server("s0:1", 0);
  without.clear_replication_key();
  EXPECT_THAT(JoinAnswered(view, without, absl::Now(), AtZero), StatusIs(absl::StatusCode::kInvalidArgument, "replication key"));
  tessera::v1::RegisterRequest short_key = Server("s0:1", 0);
  short_key.set_replication_key("short");
  EXPECT_THAT(JoinAnswered(view, short_key, absl::Now(), AtZero), StatusIs(absl::StatusCode::kInvalidArgument, "32 bytes"));
  tessera::v1::RegisterRequest worker = Worker("h", 0);
  worker.set_replication_key(std::string(32, 'w'));
  EXPECT_THAT(JoinAnswered(view, worker, absl::Now(), AtZero), StatusIs(absl::StatusCode::kInvalidArgument, "server's"));
  ASSERT_THAT(JoinAnswered(view, Server("s0:1", 0), absl::Now(), AtZero), IsOk());
  ASSERT_THAT(JoinAnswered(view, Server("s1:1", 1), absl::Now(), AtZero), IsOk());
  ASSERT_THAT(PlaceAndCommit(view, {FloatParam("w", 8)}, 16), IsOk());
  std::optional<tessera::v1::ShardMap> map = view.Map();
  ASSERT_TRUE(map.has_value());
  ASSERT_EQ(map->servers_size(), 2);
  EXPECT_EQ(map->servers(0).replication_key(), std::string(32, 'r'));
}

}  // namespace
}  // namespace tessera
