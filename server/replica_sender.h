// How a chunk's primary hands the chunk's state to its backups (ReplicationSpec). The store programs against
// ReplicaSender; GrpcReplicaSender carries the calls over gRPC, with the job's TLS and token, and the sending
// server's member key, which the backup checks against its view.
#ifndef TESSERA_SERVER_REPLICA_SENDER_H_
#define TESSERA_SERVER_REPLICA_SENDER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc.h"
#include "common/security.h"
#include "proto/ps.grpc.pb.h"

namespace tessera {

class ReplicaSender {
 public:
  virtual ~ReplicaSender() = default;
  // Hands `request` to the server at `address`; `done` runs once, on any thread, with its answer.
  virtual void Send(const std::string& address, std::shared_ptr<const tessera::v1::ReplicateRequest> request,
                    std::function<void(absl::Status)> done) = 0;
};

// Thread-safe.
class GrpcReplicaSender final : public ReplicaSender {
 public:
  // A call that takes longer than `timeout` fails (and the primary tries again).
  GrpcReplicaSender(std::shared_ptr<const Security> security, absl::Duration timeout);

  // This server's member key, from its registration: every call carries it.
  void set_member_key(std::string key);

  void Send(const std::string& address, std::shared_ptr<const tessera::v1::ReplicateRequest> request,
            std::function<void(absl::Status)> done) override;

 private:
  const absl::Duration timeout_;
  const std::shared_ptr<const Security> security_;
  StubCache<tessera::v1::ParameterServer::Stub> stubs_;
  absl::Mutex mu_;
  std::string member_key_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_REPLICA_SENDER_H_
