// The cluster view, owned by the scheduler: who is in the job (each member with an incarnation number), where
// every chunk lives, and which workers a sync round waits for, all under one epoch.
//
// Every change once the parameters are placed (a member lost, a member back, chunks moved) advances the epoch.
// The view is handed to the servers as a ShardMap (AssignShards); they check every data-plane request against
// it, and clients holding an older epoch refresh it as they refresh a stale shard map. The membership rules
// live here; for rounds and placement the view holds the state, and part of the rules lives elsewhere:
//   - a job has num_servers server ids and num_workers worker ranks, each a slot that is vacant, alive, lost or
//     (workers) done;
//   - a member that registers takes the id it asks for (even from a holder still registered: a restarted
//     process), otherwise the first vacant slot, otherwise the first lost one (a replacement takes the lost
//     member's place), with the slot's incarnation + 1; the clock a worker starts at is the caller's
//     (`start_clock`: JobCoordinator::StartClock);
//   - a sync round r waits for the workers that are alive and joined at a clock <= r: the view records each
//     worker's state and joined clock, and the servers apply the rule (ShardStore's Roster::InRound); the clock
//     table gates the clocks (clock_table.h) and, with backup workers, decides each round's members;
//   - chunks are placed, largest first, on the server holding the fewest bytes, and a lost server's chunks move
//     the same way to the survivors: common/model/shard_map.h cuts and places them (this class calls it); a
//     replacement's share and a drain's moves are planned and applied by chunk_moves.h, in two phases
//     (BeginMoves, FinishMoves).
// Which slot a registrant takes is registration_rules.h's; this class holds the state, its lock and epoch, and
// publishes every change.
#ifndef TESSERA_SCHEDULER_MEMBERSHIP_CLUSTER_VIEW_H_
#define TESSERA_SCHEDULER_MEMBERSHIP_CLUSTER_VIEW_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model/shard_map.h"
#include "proto/cluster.pb.h"
#include "scheduler/membership/chunk_moves.h"
#include "scheduler/membership/member.h"
#include "scheduler/membership/membership_events.h"

namespace tessera {

// Thread-safe. Every change of members or chunk placement is published to the subscribers (see
// membership_events.h) once made, on the thread that made it.
class ClusterView {
 public:
  // Each chunk gets `backups` backups (ReplicationSpec) while enough servers are alive.
  ClusterView(int num_servers, int num_workers, int backups = 0);

  // `listener` hears of every change from now on, after the listeners subscribed before it.
  void Subscribe(MembershipListener listener);

  // Gives the registering member a slot (see above) and a new incarnation. A member that asks for its id gets
  // it even while its holder is alive (a restarted process comes back before its old self is declared lost);
  // the old incarnation is replaced. `start_clock(slot)`, called with the slot as it was, says at which clock
  // a worker taking it starts. Advances the epoch. RESOURCE_EXHAUSTED when every slot of the role is taken;
  // INVALID_ARGUMENT for a server without an address, a requested id out of range, an unknown role or a string
  // longer than common/model/wire_limits.h allows, or a server of a job with backups without its replication key;
  // RESOURCE_EXHAUSTED for a slot that had kMaxIncarnation incarnations (they never wrap). Each incarnation gets
  // a fresh member key.
  struct Joined {
    Member member;              // as it is now
    MemberState was;            // the slot's state before: kVacant for a first join, kLost or kAlive for a return
    std::string previous_address;  // of the slot's previous holder
  };
  // When every slot is taken by a member that looks alive, and one of them has not been heard from for longer
  // than `suspect_after` or is on the registrant's host (a process restarted without its --rank or --id, before
  // its old self is declared lost): UNAVAILABLE naming that member, so the registrant retries and takes the slot
  // once it is declared lost. RESOURCE_EXHAUSTED, naming the flag, when every member answers from another host.
  [[nodiscard]] absl::StatusOr<Joined> Join(const tessera::v1::RegisterRequest& request, absl::Time now,
                                            const std::function<int64_t(const Member&)>& start_clock,
                                            absl::Duration suspect_after = absl::InfiniteDuration());

  // A resumed job: placement, parameters and every slot's incarnation from a checkpoint's view, every slot
  // vacant, the epoch past the checkpoint's. Call before anyone joins.
  void Restore(const tessera::v1::ShardMap& view);

  // A restarted scheduler takes a running job back (JobCoordinator::Register): the placement, epoch and
  // rollback of `view` (the newest a server brought back; one without parameters when nothing was placed yet),
  // and its members, each alive but awaited (Member::awaited) from `now`. Servers missing from `view` and
  // workers inactive in it are lost; slots nobody held stay vacant. Call before anyone joins.
  void Adopt(const tessera::v1::ShardMap& view, absl::Time now);
  // A member of a job taken back comes back (`request.rejoin()`, with the member key `key` it was given):
  // into its awaited slot when `key` is that incarnation's, or into a slot that no incarnation as new as its
  // own holds (it joined after the view taken back), keeping its incarnation and key. Returns it as it is now.
  // An awaited slot goes only to a caller whose key matches the digest the view holds for it (whatever
  // incarnation it names); a slot the view holds no key for (vacant, or lost) to a caller with an incarnation at
  // least its own. FAILED_PRECONDITION when a newer incarnation holds the slot (it was replaced) or the slot was
  // taken afresh; UNAUTHENTICATED for a missing or wrong key; INVALID_ARGUMENT as for Join, and for an
  // incarnation outside 1 .. kMaxIncarnation or a clock outside 0 .. kMaxClock (common/model/wire_limits.h).
  [[nodiscard]] absl::StatusOr<Member> Return(const tessera::v1::RegisterRequest& request, std::string_view key,
                                              absl::Time now);
  // Advances the epoch past `seen` and the current one (a view taken back is handed out anew under an epoch no
  // member holds yet). Only once placed.
  void AdvanceEpochPast(uint64_t seen);

  // Notes a heartbeat. NOT_FOUND for an id nobody registered; FAILED_PRECONDITION for a member that was declared
  // lost or replaced by a newer incarnation (it must register again to come back). `incarnation` 0 is not
  // checked.
  [[nodiscard]] absl::Status Touch(tessera::v1::Role role, int id, uint64_t incarnation, absl::Time now);

  // The registration of (role, id, incarnation) has been answered: from `now` its own silence counts.
  void Answered(tessera::v1::Role role, int id, uint64_t incarnation, absl::Time now);

  // Members alive but silent for longer than `timeout` become lost (not one still waiting for the answer to its
  // registration); returns them. Advances the epoch once
  // parameters are placed.
  std::vector<Member> MarkSilentLost(absl::Time now, absl::Duration timeout);

  // OK when `key` is the member key of the incarnation holding (role, id) now. INVALID_ARGUMENT for an unknown
  // role or an id outside the job; NOT_FOUND for a slot nobody holds or one awaited (a member of the job before
  // the scheduler restarted: it comes back with Register's rejoin); UNAUTHENTICATED for a missing or wrong key.
  [[nodiscard]] absl::Status CheckMemberKey(tessera::v1::Role role, int id, absl::string_view key) const;

  // An alive worker leaves: kDone (it finished) or kLost (it stopped on an error: lost at once, as if it had
  // fallen silent; it may register again, and the epoch advances once parameters are placed). Returns it as it is
  // now; nullopt when the rank is not alive.
  // `failure`: with kLost, the error the worker stopped on (published with the change).
  std::optional<Member> Leave(int worker, MemberState state, const std::string& failure = "");

  // Declares server `id` lost now when incarnation `incarnation` (0: any) holds it and is alive (a worker could
  // not reach it, nor could the scheduler); `why` goes with the change. Advances the epoch once parameters are
  // placed. Returns it as it is now; nullopt when it was not alive (lost already, or replaced).
  std::optional<Member> MarkServerLost(int id, uint64_t incarnation, const std::string& why);

  // Records the device a worker computes on (known to the worker only after it registered).
  void SetWorkerDevice(int id, const std::string& device);

  // While the job still lacks members: who is missing, and when each registered member was last heard (those
  // silent for longer than `timeout`, or declared lost, marked lost), e.g. "waiting for 1 more server and 2
  // more workers; server 0 at node7:4100 last heard 1 s ago; server 1 at node8:4100 lost, last heard 34 s
  // ago". Empty once every slot is alive or done.
  std::string WaitingSummary(absl::Time now, absl::Duration timeout) const;

  // Places `params` (every server must be alive; UNAVAILABLE naming whom it waits for otherwise) or checks them
  // against those already placed. Returns the view with them, and whether that is a change. A change is only a
  // plan, with an epoch no server has seen: the view stays as it was until Commit(placed), which the caller
  // calls once every server holds the plan. Until then the job has no placement (or the previous one).
  struct Placed {
    tessera::v1::ShardMap map;
    bool changed = false;
    uint64_t base_changes = 0;          // the view's change count the plan was made from
    tessera::v1::ShardMap placement;    // with `changed`: the placement to commit
  };
  [[nodiscard]] absl::StatusOr<Placed> Place(const std::vector<tessera::v1::ParameterSpec>& params,
                                             int64_t chunk_bytes);
  // Makes a plan from Place the view. ABORTED when the view changed since the plan (a member came or went):
  // place again.
  [[nodiscard]] absl::Status Commit(const Placed& placed);

  // The lost `server` leaves: a backup on an alive server takes over each chunk it was primary of, chunks
  // without one move to the alive servers (least-loaded bytes first), it leaves every chunk's backups, and chunks
  // short of backups get new ones on the alive servers (common/model/shard_map.h). Advances the epoch. Returns what
  // became of its chunks. FAILED_PRECONDITION when a chunk has to move and no server is alive.
  [[nodiscard]] absl::StatusOr<ChunkMoves> MoveChunksOf(int server);

  // With backups, `server` (a newcomer that holds none) becomes a backup of the chunks short of backups (their
  // primaries fill it while training goes on), and the epoch advances. Returns the chunks given it; none without
  // backups. Its share of primaries moves in two phases (ShareMoves). FAILED_PRECONDITION while a lost server's
  // chunks are not moved yet.
  [[nodiscard]] absl::StatusOr<std::vector<tessera::v1::ChunkPlacement>> GiveShareTo(int server);

  int backups() const { return backups_; }

  // Moving chunks between live servers in two phases (chunk_moves.h), each advancing the epoch.
  // tessera::DrainMoves and ShareMoves over the view now (none before placement).
  [[nodiscard]] absl::StatusOr<std::vector<ChunkMove>> DrainMoves(int server) const;
  std::vector<ChunkMove> ShareMoves(int server) const;
  // Phase 1: `to` becomes a backup of each moved chunk. FAILED_PRECONDITION, changing nothing, when a move no
  // longer fits the view (a chunk gone, or `to` not alive).
  [[nodiscard]] absl::Status BeginMoves(const std::vector<ChunkMove>& moves);
  // Phase 2: each chunk leaves `from` (a primary `from` is replaced by `to`, which leaves the backups).
  [[nodiscard]] absl::Status FinishMoves(const std::vector<ChunkMove>& moves);
  // A drained server leaves the job: it is done (not lost; no recovery follows) and its slot may be taken again.
  // nullopt when it was not alive.
  std::optional<Member> MarkServerDrained(int server);

  // SYNC recovery: every worker goes on from `clock` (the view's rollback generation grows). Advances the epoch.
  void RollBack(int64_t clock);
  // How many rollbacks the job has had.
  uint64_t rollback_generation() const;

  // The view as servers and clients see it; nullopt before parameters are placed.
  std::optional<tessera::v1::ShardMap> Map() const;
  uint64_t epoch() const;
  bool placed() const;

  std::vector<Member> Servers() const;
  std::vector<Member> Workers() const;
  bool AllServersAlive() const;

  int num_servers() const { return num_servers_; }
  int num_workers() const { return num_workers_; }

 private:
  // The changes themselves; the public methods publish them.
  absl::StatusOr<Joined> JoinSlot(const tessera::v1::RegisterRequest& request, absl::Time now,
                                  const std::function<int64_t(const Member&)>& start_clock,
                                  absl::Duration suspect_after) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ChunkMoves> MoveChunksOfUnpublished(int server) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<tessera::v1::ChunkPlacement>> GiveShareToUnpublished(int server) ABSL_LOCKS_EXCLUDED(mu_);
  MembershipEvent ChunksMoved(int server, const std::vector<tessera::v1::ChunkPlacement>& chunks) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Tells every listener of `events`, in order. Called without mu_ held (listeners read the view).
  void Publish(const std::vector<MembershipEvent>& events) ABSL_LOCKS_EXCLUDED(mu_, listeners_mu_);

  tessera::v1::ShardMap MapLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Advances the epoch once parameters are placed.
  void ChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int num_servers_;
  const int num_workers_;
  const int backups_;
  mutable absl::Mutex mu_;
  std::vector<Member> servers_ ABSL_GUARDED_BY(mu_);
  std::vector<Member> workers_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rollback_generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t planned_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // the newest epoch a plan handed out
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;  // every change, also before placement (when the epoch stays)
  int64_t rollback_clock_ ABSL_GUARDED_BY(mu_) = 0;
  // Parameters and chunk placement; set once parameters are declared.
  std::optional<tessera::v1::ShardMap> placement_ ABSL_GUARDED_BY(mu_);

  absl::Mutex listeners_mu_;
  std::vector<MembershipListener> listeners_ ABSL_GUARDED_BY(listeners_mu_);
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_MEMBERSHIP_CLUSTER_VIEW_H_
