// A parameter server's lifecycle: listen, register with the scheduler, heartbeat, serve, stop.
//
//   ServerOptions options;
//   options.scheduler_address = "127.0.0.1:7000";
//   TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(options));
//   absl::Status exit = server->Wait();  // until the job ends, the scheduler is lost, or Stop()
#ifndef TESSERA_SERVER_SERVER_H_
#define TESSERA_SERVER_SERVER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/heartbeater.h"
#include "common/daemon/http_endpoint.h"
#include "common/rpc/rpc.h"
#include "common/rpc/scheduler_client.h"
#include "common/base/thread_pool.h"
#include "server/fabric_service.h"
#include "server/server_options.h"
#include "server/replication/replica_sender.h"
#include "server/server_service.h"
#include "server/shard_store.h"

namespace tessera {

// The server's statistics in Prometheus text format (its /metrics page), labelled with its id (empty before it
// has one).
std::string ServerMetricsText(const tessera::v1::ServerStats& stats, int server_id);

// Thread-safe.
class Server {
 public:
  // Binds, registers with the scheduler (bounded retries; UNAVAILABLE naming the scheduler's address when none
  // answers) and starts heartbeating.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();

  // Blocks until the scheduler ends the job (OK), the scheduler is lost (UNAVAILABLE) or Stop() is called (OK);
  // then shuts the gRPC server down.
  [[nodiscard]] absl::Status Wait();
  // Asks Wait() to return. Never blocks; safe from any thread, including RPC handlers and signal watchers.
  void Stop(absl::Status reason = absl::OkStatus());

  int id() const { return id_.load(); }
  // The port of /healthz and /metrics; 0 when off.
  int http_port() const { return http_ ? http_->port() : 0; }
  const std::string& address() const { return address_; }
  const ShardStore& store() const { return *store_; }
  // The UCX service; null unless the job's transport is UCX.
  const FabricService* fabric() const { return fabric_.get(); }

 private:
  explicit Server(const ServerOptions& options);
  // The /metrics endpoint and, when asked for, the UCX service.
  absl::Status StartEndpoints();
  // Registers with the scheduler (which learns the control and replication keys) and takes the job's slot.
  absl::StatusOr<tessera::v1::RegisterResponse> Register(const std::string& control_key,
                                                         const std::string& replication_key);
  // Heartbeats to the scheduler; this server stops when it says the job ended or when it is lost.
  void StartHeartbeats(const tessera::v1::RegisterResponse& registered);

  const ServerOptions options_;
  std::atomic<int> id_{-1};  // set once registered (/metrics may be read before)
  std::string address_;
  // Declared before store_, so that it outlives the store's retry thread, which reports unreachable backups
  // through it.
  std::unique_ptr<SchedulerClient> scheduler_;
  std::unique_ptr<GrpcReplicaSender> replicas_;  // to the backups of this server's chunks; outlives store_
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<FabricService> fabric_;  // UCX (jobs with transport UCX); destroyed after updates_
  std::unique_ptr<ThreadPool> updates_;  // large pushes are applied here
  std::unique_ptr<ServerService> service_;
  StartedServer grpc_;
  std::unique_ptr<Heartbeater> heartbeater_;
  std::unique_ptr<HttpEndpoint> http_;

  absl::Mutex mu_;
  std::optional<absl::Status> stop_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SERVER_H_
