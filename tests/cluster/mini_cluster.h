// An in-process cluster for tests: one scheduler and N servers, each a real gRPC server on 127.0.0.1:0, talking
// real gRPC. Workers are PsClients (or whole Workers) the test creates against scheduler_address().
//
//   auto cluster = MiniCluster::Start(job);        // job.cluster().num_servers servers
//   auto client = (*cluster)->ConnectClient();     // a registered worker
//   ...
//   absl::StatusOr<nlohmann::json> summary = (*cluster)->WaitForSummary(absl::Seconds(30));
#ifndef TESSERA_TESTS_CLUSTER_MINI_CLUSTER_H_
#define TESSERA_TESTS_CLUSTER_MINI_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "scheduler/scheduler.h"
#include "server/server.h"
#include "tests/testing/param_spec.h"
#include "worker/client/ps_client.h"

namespace tessera::testing {

// Not thread-safe (the daemons inside are).
class MiniCluster {
 public:
  // Workers silent for `heartbeat_timeout` are lost (long by default: ConnectClient's clients do not heartbeat).
  // Every daemon and client uses `security` (TLS files, the job token). Each server's rows of embedding tables
  // may take `server_row_memory_mb` (0: no cap).
  static absl::StatusOr<std::unique_ptr<MiniCluster>> Start(const tessera::v1::JobSpec& job,
                                                            absl::Duration heartbeat_timeout = absl::Minutes(5),
                                                            const SecurityOptions& security = {},
                                                            int64_t server_row_memory_mb = 0);
  ~MiniCluster();

  const std::string& scheduler_address() const { return scheduler_->address(); }
  Scheduler& scheduler() { return *scheduler_; }
  Server& server(int i) { return *servers_[i]; }
  int num_servers() const { return static_cast<int>(servers_.size()); }

  // A registered worker client; heartbeats off unless asked for (tests drive every call). `security`: the
  // cluster's by default.
  absl::StatusOr<std::unique_ptr<PsClient>> ConnectClient(bool heartbeat = false,
                                                          const SecurityOptions* security = nullptr);

  // The job summary once every worker called Done; DEADLINE_EXCEEDED naming the wait otherwise.
  absl::StatusOr<nlohmann::json> WaitForSummary(absl::Duration timeout);

 private:
  MiniCluster() = default;
  SecurityOptions security_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<Server>> servers_;
};

// Adds `client`'s member key to a hand-made call, so that servers and the scheduler take it as that worker's.
void ActAs(const PsClient& client, grpc::ClientContext& context);

// A job for cluster tests: synthetic data, the given mode, `servers` and `workers`, tiny chunks so parameters
// span servers.
tessera::v1::JobSpec TestJob(tessera::v1::ConsistencySpec::Mode mode, int servers, int workers);

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_CLUSTER_MINI_CLUSTER_H_
