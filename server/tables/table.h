// The seam between what every kind of parameter a server holds shares and what one kind is.
//
// A table is one kind of parameter as a server holds it: tables/dense_table.h holds dense tensors cut into
// chunks, tables/sparse_table.h embedding tables (rows keyed by 64-bit ids) cut into hash slots. A table is made
// of units: what the cluster view places on a server, what is replicated to backups and checkpointed as one (a
// dense parameter's chunk; a sparse table's hash slot). The store (server/shard_store.h) keeps what does not depend
// on the kind: the epoch and member checks, exactly-once pushes, the consistency policy, the exchanges waiting
// on rounds, snapshots and counters. Adopting a view (server/view_adoption.h) and replication
// (server/replication/) work on tables and units through this interface only.
#ifndef TESSERA_SERVER_TABLES_TABLE_H_
#define TESSERA_SERVER_TABLES_TABLE_H_

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/model/update_rule.h"
#include "proto/checkpoint.pb.h"
#include "proto/cluster.pb.h"
#include "proto/ps.pb.h"
#include "server/tables/exchange_waiter.h"

namespace tessera {

struct Chunk;  // server/tables/chunk.h

// What the job fixes for the units a table creates. The server's JobConfig (server/job_config.h) is one: through it
// the tables reach the job's consistency mode without depending on server/consistency/, which depends on them.
class UnitSettings {
 public:
  virtual ~UnitSettings() = default;
  virtual const tessera::v1::JobSpec& job_spec() const = 0;
  // Optimizer state a dense parameter keeps per value (UpdateRule::state_slots).
  virtual int state_slots() const = 0;
  // Readies a new chunk for the job's consistency mode (a SYNC round's buffers); the chunk's lock is held.
  virtual void PrepareChunkLocked(Chunk& chunk, int workers) const = 0;
};

// A unit's name: its table (a dense parameter's name) and its index in the table.
using UnitKey = std::pair<std::string, int>;

// Replication (ReplicationSpec) of one unit. On the unit's primary: its backups in the adopted view, the newest
// version every one of them holds, and the callers waiting for their update to reach them. On a backup: whose
// state it holds.
struct UnitReplication {
  std::vector<int> backups;          // server ids
  uint64_t generation = 0;           // grows with every change of `backups`
  int64_t replicated_version = -1;   // every backup holds this version; -1: not known (hand the state over)
  // The updates applied since version `log_base`, in order: what the next hand-over carries instead of the whole
  // state while the backups hold `log_base` or later. -1: not kept (the next hand-over is the whole state, and
  // the log starts from it); dropped when it would be larger than the state.
  int64_t log_base = -1;
  std::vector<tessera::v1::ChunkUpdate> log;
  size_t log_bytes = 0;
  bool shipping = false;             // a hand-over to the backups is on its way
  std::vector<std::pair<int64_t, std::function<void(absl::Status)>>> waiting;  // (version, done)
  // On a backup: the primary the view names, and the view epoch of the last state taken from a primary.
  int primary = -1;
  uint64_t taken_epoch = 0;
  // On a backup: it has taken a state or updates from a primary (a copy made by this server alone holds only
  // the initial values). A view that makes an unfilled copy the primary leaves the unit without its state.
  bool filled = false;
  // Promoted before it was filled: the unit's state is lost on this server, and every request for it says so.
  bool lost = false;
};

// One unit of a table. Its lock serialises every request to it; every method here runs under it.
struct Unit {
  Unit(std::string table, int index) : key(std::move(table), index) {}
  virtual ~Unit() = default;
  Unit(const Unit&) = delete;
  Unit& operator=(const Unit&) = delete;

  const UnitKey key;
  mutable absl::Mutex mu;
  int64_t version ABSL_GUARDED_BY(mu) = 0;  // updates applied, assignments included
  UnitReplication replication ABSL_GUARDED_BY(mu);

  // The unit's state as a checkpoint holds it.
  virtual tessera::v1::ChunkState StateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  // As its backups take it: only updates applied count (not gradients still collected for an open round, which
  // a backup taking over collects again when they are retried); without `values`, the bookkeeping only (the
  // values travel as the logged updates).
  virtual tessera::v1::ChunkState ReplicaStateLocked(bool values) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  // On a backup, a primary's hand-over: the request's updates (the first follows the version held) applied with
  // `rule`, or, without updates, its whole state. FAILED_PRECONDITION, changing nothing, for updates that do not
  // follow; INVALID_ARGUMENT for a state or update of another size or with non-finite values.
  virtual absl::Status TakeReplicaLocked(const UpdateRule& rule, const tessera::v1::ReplicateRequest& request,
                                         int workers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  // Takes a checkpoint's state. Sequence tables are kept only for worker ids with `keep_seq`; exchanges waiting
  // on the unit are moved to `dropped`. INVALID_ARGUMENT, changing nothing, for a state that does not fit.
  virtual absl::Status RestoreLocked(const tessera::v1::ChunkState& state, const std::vector<bool>& keep_seq,
                                     std::vector<std::shared_ptr<ExchangeWaiter>>& dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  // A worker rank taken by a new process (joining at `joined_clock`): its sequence starts again.
  virtual void RenewWorkerLocked(int worker, int64_t joined_clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  // Hands over the exchanges waiting on the unit (it moves away, changes role, or the server shuts down).
  virtual std::vector<std::shared_ptr<ExchangeWaiter>> TakeWaitersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
};

// Where the view places one unit of a table.
struct UnitPlacement {
  UnitKey key;
  int primary = -1;
  std::vector<int> backups;
  int source = -1;  // the table's own reference into the view (a dense chunk's index in ShardMap.chunks)
  bool On(int server) const {
    return primary == server || std::find(backups.begin(), backups.end(), server) != backups.end();
  }
};

// One kind of parameter, as one server holds it. Not thread-safe: the store calls it under its own lock, held
// exclusively for the calls that change which units are held. Units are never freed while the store lives (one
// the view moves away is retired), so a request that found one keeps a valid object.
class Table {
 public:
  enum class Role { kPrimary, kBackup };

  virtual ~Table() = default;
  virtual std::string_view kind() const = 0;

  // The placements of this table's units in `map`. INVALID_ARGUMENT for a map the table cannot use.
  virtual absl::StatusOr<std::vector<UnitPlacement>> Placements(const tessera::v1::ShardMap& map) const = 0;
  // The unit held in `role`, or nullptr.
  virtual Unit* Find(const UnitKey& key, Role role) const = 0;
  // Every unit held in `role`, in key order.
  virtual std::vector<Unit*> Units(Role role) const = 0;
  // Creates the unit the view places here in `role`, with its initial values unless `from_checkpoint` (the
  // caller restores it). INVALID_ARGUMENT when the view does not describe it.
  virtual absl::StatusOr<Unit*> Create(const UnitSettings& settings, const tessera::v1::ShardMap& map,
                                       const UnitPlacement& placement, Role role, bool from_checkpoint) = 0;
  // Moves the unit held in the other role to `role` (a backup made primary, a primary made backup).
  virtual Unit* ChangeRole(const UnitKey& key, Role role) = 0;
  // The unit leaves this server (the view placed it elsewhere): retired, never freed.
  virtual void Retire(const UnitKey& key, Role role) = 0;
  // Adds what the table holds to a server's statistics.
  virtual void AddStats(tessera::v1::ServerStats& stats) const = 0;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_TABLES_TABLE_H_
