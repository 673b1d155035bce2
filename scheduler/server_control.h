// How the scheduler's core reaches the servers, without naming a transport: assign shards, collect statistics,
// end the job. GrpcServerControl (grpc_server_control.h) is the gRPC implementation.
#ifndef TESSERA_SCHEDULER_SERVER_CONTROL_H_
#define TESSERA_SCHEDULER_SERVER_CONTROL_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/staleness_histogram.h"
#include "proto/cluster.pb.h"
#include "proto/ps.pb.h"

namespace tessera {

// The servers' statistics summed over servers: chunks and chunk updates over the servers in the job now
// (restored chunks carry their updates with them), counters over every server the job ever had.
struct ClusterStats {
  int64_t chunks = 0;
  int64_t chunk_updates = 0;
  int64_t pushes = 0;
  int64_t duplicate_pushes = 0;
  int64_t late_pushes = 0;
  int64_t push_bytes = 0;     // values of the pushes the servers received
  int64_t replica_bytes = 0;  // chunk state primaries handed to backups
  // Delay compensation: the pushes corrected, and the squared norms of their gradients and corrections.
  int64_t compensated_pushes = 0;
  double compensated_grad_sq = 0;
  double compensation_sq = 0;
  StalenessHistogram staleness;
  std::vector<StalenessHistogram> worker_staleness;  // by worker id

  // Model updates: chunk updates per chunk (every chunk of a dense model is updated once per model update).
  int64_t model_updates() const { return chunks == 0 ? 0 : chunk_updates / chunks; }
};

// One server's answer to a statistics request.
struct ServerStatsAnswer {
  int server_id = -1;
  uint64_t incarnation = 0;
  absl::StatusOr<tessera::v1::ServerStats> stats;
};

// Thread-safe implementations required. Each call addresses every server in the map and blocks until all
// have answered or one failed (its error, naming the server, is returned).
class ServerControl {
 public:
  virtual ~ServerControl() = default;
  // The key the server at `address` made for its control calls (RegisterRequest.control_key); every control call
  // to that address carries it from now on.
  virtual void SetControlKey(const std::string& address, const std::string& control_key) = 0;
  // Hands the view to every server in it; with `restore_files`, the chunks new to a server (all of them with
  // `restore_all`) are restored from those checkpoint files.
  [[nodiscard]] virtual absl::Status Assign(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job,
                                            const std::vector<std::string>& restore_files = {},
                                            bool restore_all = false) = 0;
  // Asks every server to write its checkpoint file, `folder`/server-ID.shard, at `clock` (see
  // CheckpointRequest), as a delta over its file in `base_folder` when that is set; returns the files' paths in
  // the map's order.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> Checkpoint(const tessera::v1::ShardMap& map,
                                                                            const std::string& folder, int64_t clock,
                                                                            bool at_version, absl::Duration timeout,
                                                                            const std::string& base_folder) = 0;
  // Every server's answer, in the map's order (a server that does not answer does not fail the others).
  [[nodiscard]] virtual std::vector<ServerStatsAnswer> Stats(const tessera::v1::ShardMap& map) = 0;
  [[nodiscard]] virtual absl::Status Shutdown(const tessera::v1::ShardMap& map) = 0;
  // Whether the server at `address` answers a control call within `timeout` (OK when it does; UNAVAILABLE or
  // DEADLINE_EXCEEDED when nothing answers).
  [[nodiscard]] virtual absl::Status Probe(const std::string& address, absl::Duration timeout) = 0;
  // SYNC with backup workers: tells every server which workers make the rounds in `request`.
  [[nodiscard]] virtual absl::Status DecideRounds(const tessera::v1::ShardMap& map,
                                                  const tessera::v1::DecideRoundsRequest& request) = 0;
  // The job has stopped: no view is handed over any more. Assign calls in flight are cancelled (one to a server
  // that froze would hold the job's end for its whole deadline) and later ones fail CANCELLED at once; the
  // other calls (statistics, checkpoints, the servers' shutdown) go on as before.
  virtual void EndViewChanges() = 0;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_SERVER_CONTROL_H_
