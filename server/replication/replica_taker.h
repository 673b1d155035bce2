// Replication on a backup: takes the state of a unit this server backs up from the server the view names as the
// unit's primary, signed by that server for this one (server/replica_auth.h).
#ifndef TESSERA_SERVER_REPLICATION_REPLICA_TAKER_H_
#define TESSERA_SERVER_REPLICATION_REPLICA_TAKER_H_

#include <atomic>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/ps.pb.h"
#include "server/store_state.h"

namespace tessera {

// Thread-safe.
class ReplicaTaker {
 public:
  explicit ReplicaTaker(StoreState& state) : state_(state) {}

  // Takes a primary's call: the hand-overs of `batch`, signed once for this server. See ShardStore::TakeReplicas.
  absl::StatusOr<std::vector<absl::StatusOr<int64_t>>> Take(const tessera::v1::ReplicateBatch& batch,
                                                            std::string_view signature) ABSL_LOCKS_EXCLUDED(state_.mu);

  // Bytes of unit state taken from primaries.
  int64_t bytes_received() const { return bytes_received_.load(); }

 private:
  // OK when `signature` is `primary`'s signature (with the replication key the view holds for it) of a Replicate
  // with `digest` for this server, its id and incarnation; UNAUTHENTICATED naming `what` otherwise.
  absl::Status CheckSigned(const Peer& primary, const std::string& digest, std::string_view signature,
                           const std::string& what) const ABSL_SHARED_LOCKS_REQUIRED(state_.mu);
  // The checks of the whole call, before any unit is taken: numbers within bounds, one primary, no epoch newer
  // than this server's view, that primary's signature of `digest` (the batch's ReplicateDigest).
  absl::Status CheckCall(const tessera::v1::ReplicateBatch& batch, const std::string& digest,
                         std::string_view signature) const
      ABSL_SHARED_LOCKS_REQUIRED(state_.mu);
  // Takes one unit's hand-over of a checked call; returns the version held.
  absl::StatusOr<int64_t> TakeUnit(const tessera::v1::ReplicateRequest& request)
      ABSL_SHARED_LOCKS_REQUIRED(state_.mu);

  StoreState& state_;
  std::atomic<int64_t> bytes_received_{0};
};

}  // namespace tessera

#endif  // TESSERA_SERVER_REPLICATION_REPLICA_TAKER_H_
