// The calls for rows of embedding tables (ParameterSpec.embedding) behind PsClient::PullRows and PushRows: the
// ids routed to the servers that are primary of their hash slots (common/model/shard_map.h EmbeddingSlot), one call
// per server, all in flight at once: over gRPC, or over the job's fabric transport (UCX) when it has one.
#ifndef TESSERA_WORKER_CLIENT_ROW_CALLS_H_
#define TESSERA_WORKER_CLIENT_ROW_CALLS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/rpc/rpc.h"
#include "common/rpc/security.h"
#include "common/model/shard_map.h"
#include "proto/ps.grpc.pb.h"
#include "worker/client/chunk_transport.h"
#include "worker/client/chunk_types.h"

namespace tessera {

// The ids of one request that go to one server.
struct RowRoute {
  int server_id = -1;
  std::vector<size_t> positions;  // into the request's ids
};

// An embedding table as a view places it: its row width and each slot's primary.
struct RowTable {
  std::string name;
  int64_t dim = 0;
  std::vector<int> slot_server;  // by slot
};

// `name` in `map`: NOT_FOUND when it is not declared, INVALID_ARGUMENT when it is a dense parameter.
absl::StatusOr<RowTable> FindRowTable(const ShardMapIndex& map, const std::string& name);
// The routes of `ids` (ids[i] to its slot's primary), by server id.
std::vector<RowRoute> RouteRows(const RowTable& table, absl::Span<const uint64_t> ids);

// Who calls, and the view its requests carry. Thread-safe.
class RowCaller {
 public:
  // `fabric` (not owned; null: gRPC) carries the calls when the job's transport is UCX.
  RowCaller(std::shared_ptr<const Security> security, absl::Duration timeout, ChunkTransport* fabric = nullptr);

  using Caller = CallerIdentity;

  // Reads the rows of ids[route.positions] into `out` (ids.size() rows of table.dim), the routes in parallel
  // (over gRPC a route of many ids as several calls). Each route's status, in the routes' order.
  // `clock`: the caller's (RowPullRequest.clock).
  std::vector<absl::Status> Pull(const ShardMapIndex& map, const RowTable& table, const std::vector<RowRoute>& routes,
                                 absl::Span<const uint64_t> ids, int64_t clock, const Caller& who,
                                 absl::Span<float> out);
  // Sends `request` (table, seq, clock, batch size, lr factor filled in) with the ids and gradients of each
  // route. Each route's status; `updated` and `refused` add up what the servers applied, `late` is set when a
  // server's round had closed without the push.
  std::vector<absl::Status> Push(const ShardMapIndex& map, const std::vector<RowRoute>& routes,
                                 const tessera::v1::RowPushRequest& request, absl::Span<const uint64_t> ids,
                                 absl::Span<const float> grads, int64_t dim, const Caller& who, int64_t& updated,
                                 int64_t& refused, bool& late);

 private:
  // The most ids one call of a pull carries over gRPC.
  static constexpr size_t kRowsPerPullCall = 8192;
  // Pull, one call per route.
  std::vector<absl::Status> PullRoutes(const ShardMapIndex& map, const RowTable& table,
                                       const std::vector<RowRoute>& routes, absl::Span<const uint64_t> ids,
                                       int64_t clock, const Caller& who, absl::Span<float> out);

  const std::shared_ptr<const Security> security_;
  const absl::Duration timeout_;
  ChunkTransport* const fabric_;
  StubCache<tessera::v1::ParameterServer::Stub> stubs_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_CLIENT_ROW_CALLS_H_
