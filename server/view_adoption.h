// A server adopting a new cluster view: one method per kind of change a view brings to the units it holds. A
// backup made primary (promotion) or a primary made backup (demotion), a unit moving in (created, or restored
// from a checkpoint) or out (retired), a rollback restoring every unit, the roster of a primary's backups, and
// the view's servers and workers. ShardStore::Assign runs it under the store's lock (StoreState::mu, held
// exclusively); what must happen once no lock is held is collected in `results()`.
#ifndef TESSERA_SERVER_VIEW_ADOPTION_H_
#define TESSERA_SERVER_VIEW_ADOPTION_H_

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/checkpoint.pb.h"
#include "proto/cluster.pb.h"
#include "proto/job.pb.h"
#include "server/store_state.h"

namespace tessera {

class ViewAdoption {
 public:
  // Released callers: each runs once no lock is held, with its status.
  using Released = std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>;
  struct Results {
    std::vector<std::shared_ptr<ExchangeWaiter>> dropped;  // exchanges to answer MovedAway
    Released released;
    std::vector<Unit*> to_ship;  // primaries whose backups are to be handed the whole state
  };

  // `restore`: the servers' checkpoint files of one checkpoint (units new to this server take their state from
  // it); with `restore_all` every unit does (a rollback). See ShardStore::Assign.
  ViewAdoption(StoreState& state, const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job,
               const std::vector<tessera::v1::ShardCheckpoint>* restore, bool restore_all)
      : state_(state), map_(map), job_(job), restore_(restore), restore_all_(restore != nullptr && restore_all) {}

  // Adopts the view as server `server_id`: false when it is the view held already (nothing changes).
  // FAILED_PRECONDITION for another job or server id, an older view, or a unit to restore missing from the
  // files; INVALID_ARGUMENT for a view the tables cannot use.
  absl::StatusOr<bool> Run(int server_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);

  Results& results() { return results_; }
  // Tells the thread-safety analysis that the caller holds the store's lock, which this adoption works under.
  void AssertLocked() const ABSL_ASSERT_EXCLUSIVE_LOCK(state_.mu) { state_.mu.AssertHeld(); }

 private:
  using Role = Table::Role;

  // The job and server are the ones held, and the view is newer: false for the one held already.
  absl::StatusOr<bool> Check(int server_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // The checkpoint's unit states by key, and the worker ranks whose sequence tables it keeps.
  void IndexCheckpoint();
  // One unit the view places on this server.
  absl::Status AdoptUnit(Table& table, const UnitPlacement& placement) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // Promotion (a backup serving from the state it holds) or demotion: nullptr when the unit is not held in the
  // other role.
  Unit* ChangeRole(Table& table, const UnitKey& key, Role role) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // A unit moving in: created, from the checkpoint when there is one.
  absl::Status MoveIn(Table& table, const UnitPlacement& placement, Role role)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // The unit takes its state from the checkpoint.
  absl::Status Restore(Unit& unit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(unit.mu);
  // On a backup: the unit follows the primary the view names; callers waiting on its old backups are released.
  void FollowPrimary(Unit& unit, const UnitPlacement& placement) ABSL_EXCLUSIVE_LOCKS_REQUIRED(unit.mu);
  // On the primary: the unit's backups. New backups (or restored state) are handed the whole state.
  void LeadBackups(Unit& unit, const UnitPlacement& placement)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(unit.mu, state_.mu);
  // Units the view placed elsewhere leave (retired, not freed).
  void MoveOut(Table& table, const std::vector<UnitPlacement>& placements) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  void TakePeers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // The view's workers: a rank with a new process starts a new sequence. INVALID_ARGUMENT for a worker id
  // outside the job.
  absl::Status TakeWorkers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);

  StoreState& state_;
  const tessera::v1::ShardMap& map_;
  const tessera::v1::JobSpec& job_;
  const std::vector<tessera::v1::ShardCheckpoint>* const restore_;
  const bool restore_all_;
  std::map<UnitKey, const tessera::v1::ChunkState*> saved_;
  std::map<UnitKey, tessera::v1::ChunkState> merged_;  // slots of a delta checkpoint over its full one
  absl::Status index_error_;                            // a delta the files could not be merged with
  std::vector<bool> keep_seq_;
  Results results_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_VIEW_ADOPTION_H_
