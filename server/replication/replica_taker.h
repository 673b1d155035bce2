// Replication on a backup: takes the state of a unit this server backs up from the server the view names as the
// unit's primary, signed by that server for this one (server/replica_auth.h).
#ifndef TESSERA_SERVER_REPLICATION_REPLICA_TAKER_H_
#define TESSERA_SERVER_REPLICATION_REPLICA_TAKER_H_

#include <atomic>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/ps.pb.h"
#include "server/store_state.h"

namespace tessera {

// Thread-safe.
class ReplicaTaker {
 public:
  explicit ReplicaTaker(StoreState& state) : state_(state) {}

  // Takes a primary's hand-over; returns the version held. See ShardStore::TakeReplica.
  absl::StatusOr<int64_t> Take(const tessera::v1::ReplicateRequest& request, std::string_view signature)
      ABSL_LOCKS_EXCLUDED(state_.mu);

  // Bytes of unit state taken from primaries.
  int64_t bytes_received() const { return bytes_received_.load(); }

 private:
  // OK when `signature` is `primary`'s signature (with the replication key the view holds for it) of a Replicate
  // with `digest` for this server, its id and incarnation; UNAUTHENTICATED naming `what` otherwise.
  absl::Status CheckSigned(const Peer& primary, const std::string& digest, std::string_view signature,
                           const std::string& what) const ABSL_SHARED_LOCKS_REQUIRED(state_.mu);
  // The unit this server backs up for the request's sender, or why it is not one.
  absl::StatusOr<Unit*> FindBackedUp(const tessera::v1::ReplicateRequest& request, const std::string& digest,
                                     std::string_view signature) const ABSL_SHARED_LOCKS_REQUIRED(state_.mu);

  StoreState& state_;
  std::atomic<int64_t> bytes_received_{0};
};

}  // namespace tessera

#endif  // TESSERA_SERVER_REPLICATION_REPLICA_TAKER_H_
