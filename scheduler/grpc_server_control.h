// ServerControl over gRPC: one stub per server address, created on first use.
#ifndef TESSERA_SCHEDULER_GRPC_SERVER_CONTROL_H_
#define TESSERA_SCHEDULER_GRPC_SERVER_CONTROL_H_

#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/rpc/rpc.h"
#include "common/rpc/security.h"
#include "proto/ps.grpc.pb.h"
#include "scheduler/server_control.h"

namespace tessera {

// Thread-safe.
class GrpcServerControl final : public ServerControl {
 public:
  // Every call carries `security`'s job token, over its TLS when it has one.
  explicit GrpcServerControl(std::shared_ptr<const Security> security)
      : security_(security),
        stubs_(std::move(security), [](std::shared_ptr<grpc::Channel> channel) {
          return tessera::v1::ParameterServer::NewStub(channel);
        }) {}

  void SetControlKey(const std::string& address, const std::string& control_key) override;
  absl::Status Assign(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job,
                      const std::vector<std::string>& restore_files, bool restore_all) override;
  absl::StatusOr<std::vector<std::string>> Checkpoint(const tessera::v1::ShardMap& map, const std::string& folder,
                                                      int64_t clock, bool at_version, absl::Duration timeout,
                                                      const std::string& base_folder) override;
  std::vector<ServerStatsAnswer> Stats(const tessera::v1::ShardMap& map) override;
  absl::Status Probe(const std::string& address, absl::Duration timeout) override;
  absl::Status Shutdown(const tessera::v1::ShardMap& map) override;
  absl::Status DecideRounds(const tessera::v1::ShardMap& map, const tessera::v1::DecideRoundsRequest& request) override;
  void EndViewChanges() override;

 private:
  tessera::v1::ParameterServer::Stub* StubFor(const std::string& address);
  // Sets `context`'s deadline, the job token and the control key of the server at `address`.
  void Prepare(grpc::ClientContext& context, const std::string& address, absl::Duration timeout);

  const std::shared_ptr<const Security> security_;
  absl::Mutex mu_;
  std::map<std::string, std::string> control_keys_ ABSL_GUARDED_BY(mu_);
  bool views_ended_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> assigning_ ABSL_GUARDED_BY(mu_);  // Assign calls in flight
  StubCache<tessera::v1::ParameterServer::Stub> stubs_;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_GRPC_SERVER_CONTROL_H_
