// Replication on a backup: takes the state of a unit this server backs up from the server the view names as the
// unit's primary, with that server's credential for this one (server/replica_auth.h).
#ifndef TESSERA_SERVER_REPLICATION_REPLICA_TAKER_H_
#define TESSERA_SERVER_REPLICATION_REPLICA_TAKER_H_

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/ps.pb.h"
#include "server/replica_auth.h"
#include "server/store_state.h"

namespace tessera {

// Thread-safe.
class ReplicaTaker {
 public:
  // `key` is this server's replication key (null: every call is refused).
  ReplicaTaker(StoreState& state, std::shared_ptr<const ReplicaKey> key) : state_(state), key_(std::move(key)) {}

  // Takes a primary's call: the hand-overs of `batch`, with one credential for this server. See
  // ShardStore::TakeReplicas.
  absl::StatusOr<std::vector<absl::StatusOr<int64_t>>> Take(const tessera::v1::ReplicateBatch& batch,
                                                            std::string_view credential)
      ABSL_LOCKS_EXCLUDED(state_.mu);

  // Bytes of unit state taken from primaries.
  int64_t bytes_received() const { return bytes_received_.load(); }

 private:
  // What the credential was checked against: the primary's key in the view then, and the result.
  struct Checked {
    std::string primary_key;
    bool authentic = false;
  };
  // Checks `credential` for `batch` against the key the current view holds for the units' primary, without
  // holding the lock while the units are read.
  Checked CheckCredential(const tessera::v1::ReplicateBatch& batch, std::string_view credential) const
      ABSL_LOCKS_EXCLUDED(state_.mu);
  // The checks of the whole call, before any unit is taken: numbers within bounds, one primary, no epoch newer
  // than this server's view, a credential of that primary (with the key the view still holds for it).
  absl::Status CheckCall(const tessera::v1::ReplicateBatch& batch, const Checked& checked,
                         std::string_view credential) const ABSL_SHARED_LOCKS_REQUIRED(state_.mu);
  // Takes one unit's hand-over of a checked call; returns the version held.
  absl::StatusOr<int64_t> TakeUnit(const tessera::v1::ReplicateRequest& request)
      ABSL_SHARED_LOCKS_REQUIRED(state_.mu);

  StoreState& state_;
  const std::shared_ptr<const ReplicaKey> key_;
  std::atomic<int64_t> bytes_received_{0};
};

}  // namespace tessera

#endif  // TESSERA_SERVER_REPLICATION_REPLICA_TAKER_H_
