// How a chunk's primary hands the chunk's state to its backups (ReplicationSpec). The store programs against
// ReplicaSender; GrpcReplicaSender carries the calls over gRPC, with the job's TLS and token, each with a
// credential for the one backup it is sent to, under the key the two servers share (server/replica_auth.h), which
// the backup checks against its view. No member key travels between servers.
#ifndef TESSERA_SERVER_REPLICATION_REPLICA_SENDER_H_
#define TESSERA_SERVER_REPLICATION_REPLICA_SENDER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/rpc/rpc.h"
#include "absl/status/statusor.h"
#include "common/rpc/security.h"
#include "common/base/thread_pool.h"
#include "proto/ps.grpc.pb.h"
#include "server/replica_auth.h"

namespace tessera {

// A backup as the primary's view names it.
struct ReplicaTarget {
  std::string address;
  int server_id = -1;
  uint64_t incarnation = 0;
  std::string replication_key;  // the backup's public key
};

class ReplicaSender {
 public:
  virtual ~ReplicaSender() = default;
  // Hands `request` to `backup`; `done` runs once, on any thread, with its answer: the version the backup says
  // it holds now, or the error.
  virtual void Send(const ReplicaTarget& backup, std::shared_ptr<const tessera::v1::ReplicateRequest> request,
                    std::function<void(absl::StatusOr<int64_t>)> done) = 0;
};

// Thread-safe. At most one call is in flight to each backup: hand-overs that come while it is on its way (or
// while it is being started, on the sender's own thread) go together in the next call (one ReplicateBatch, one credential), up to `batch_bytes` of values a call, so that a
// push of many chunks costs a backup a few calls rather than one per chunk.
class GrpcReplicaSender final : public ReplicaSender {
 public:
  // Values (and optimizer state) carried by one call at most, beside the first hand-over it holds.
  static constexpr size_t kDefaultBatchBytes = size_t{16} << 20;

  // A call that takes longer than `timeout` fails (and the primary tries again). `key` is this server's
  // replication key (its public half is in the view): every call carries a credential for its backup made with it.
  GrpcReplicaSender(std::shared_ptr<const Security> security, absl::Duration timeout,
                    std::shared_ptr<const ReplicaKey> key, size_t batch_bytes = kDefaultBatchBytes);

  void Send(const ReplicaTarget& backup, std::shared_ptr<const tessera::v1::ReplicateRequest> request,
            std::function<void(absl::StatusOr<int64_t>)> done) override;

 private:
  // What the calls in flight share with the sender (they may end after it).
  struct Core;
  const std::shared_ptr<Core> core_;
  // Starts each backup's first call after an idle spell. Last member: what it holds starts before the rest goes.
  SerialExecutor starts_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_REPLICATION_REPLICA_SENDER_H_
