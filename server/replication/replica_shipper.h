// Replication on a primary (ReplicationSpec.backups > 0): hands what the server applied to a unit over to the
// unit's backups, and tells each update's caller once every backup holds it.
//
// After an update, the unit's state goes to its backups: the updates since the version they all hold (the
// unit's log) or, when those are not kept, the whole state. Updates arriving while a hand-over is on its way are
// coalesced into the next one. A backup that does not answer is tried again a little later (and reported, so
// that its loss is noticed before the heartbeat timeout); one out of step is sent the whole state.
#ifndef TESSERA_SERVER_REPLICATION_REPLICA_SHIPPER_H_
#define TESSERA_SERVER_REPLICATION_REPLICA_SHIPPER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/thread_pool.h"
#include "server/replication/replica_sender.h"
#include "server/store_state.h"

namespace tessera {

// Thread-safe.
class ReplicaShipper {
 public:
  // `sender` (not owned; may be null for a server that cannot reach its peers) carries the hand-overs.
  ReplicaShipper(StoreState& state, ReplicaSender* sender) : state_(state), sender_(sender) {}
  // Waits for hand-overs still on their way.
  ~ReplicaShipper();
  ReplicaShipper(const ReplicaShipper&) = delete;
  ReplicaShipper& operator=(const ReplicaShipper&) = delete;

  // Called (on the retry thread, at most once a second per server) with a backup that did not answer a
  // hand-over. Set before the first hand-over.
  void set_on_unreachable(std::function<void(int server_id, uint64_t incarnation, const absl::Status&)> report) {
    on_unreachable_ = std::move(report);
  }
  bool can_ship() const { return sender_ != nullptr; }

  // After an update of `unit` to `version`: `done` runs once every backup holds that version (at once without
  // backups; with the error when the unit leaves this server first).
  void AfterApplied(Unit& unit, int64_t version, std::function<void(absl::Status)> done)
      ABSL_LOCKS_EXCLUDED(state_.mu, unit.mu);
  // Hands the unit's state to its backups, unless a hand-over is on its way or they hold it already.
  void Ship(Unit& unit) ABSL_LOCKS_EXCLUDED(state_.mu, unit.mu);

  // Bytes of unit state sent to backups (each backup counted).
  int64_t bytes_sent() const { return bytes_sent_.load(); }

 private:
  // One hand-over of a unit to its backups.
  struct Handover {
    std::shared_ptr<tessera::v1::ReplicateRequest> request;
    std::vector<ReplicaTarget> targets;
    uint64_t generation = 0;
  };

  // The hand-over the unit needs now, if any.
  std::optional<Handover> PrepareLocked(Unit& unit) ABSL_SHARED_LOCKS_REQUIRED(state_.mu)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(unit.mu);
  // Sends it to every backup; Shipped runs once all have answered.
  void Send(Unit& unit, Handover handover);
  // A hand-over of `version` to the backups of `generation` ended with `status` (`failed`: the first backup
  // that did not take it, -1 when all did).
  void Shipped(Unit& unit, uint64_t generation, int64_t version, const absl::Status& status, int failed)
      ABSL_LOCKS_EXCLUDED(state_.mu, unit.mu);
  // Hands the unit over again a little later (backup `failed` did not take it with `why`).
  void ShipLater(Unit* unit, int failed, const absl::Status& why) ABSL_LOCKS_EXCLUDED(retry_mu_);
  // Reports the backups that did not answer (at most once a second each), then ships the units waiting.
  void Retry() ABSL_LOCKS_EXCLUDED(retry_mu_);

  StoreState& state_;
  ReplicaSender* const sender_;
  std::atomic<int64_t> bytes_sent_{0};
  std::function<void(int, uint64_t, const absl::Status&)> on_unreachable_;

  absl::Mutex ships_mu_;
  int ships_in_flight_ ABSL_GUARDED_BY(ships_mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(ships_mu_) = false;

  absl::Mutex retry_mu_;
  std::set<Unit*> retry_ ABSL_GUARDED_BY(retry_mu_);
  bool retry_scheduled_ ABSL_GUARDED_BY(retry_mu_) = false;
  std::map<int, absl::Status> unreachable_ ABSL_GUARDED_BY(retry_mu_);  // backups that did not answer, to report
  std::map<int, absl::Time> reported_ ABSL_GUARDED_BY(retry_mu_);       // when each was last reported

  // Last member: hand-overs waiting to be tried again end before the rest goes.
  SerialExecutor retries_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_REPLICATION_REPLICA_SHIPPER_H_
