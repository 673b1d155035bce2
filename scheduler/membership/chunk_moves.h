// Moving chunks between live servers, planned and applied on a ShardMap (no locks, no events: ClusterView calls
// these under its lock and publishes what changed). A move goes in two phases, with no rollback: first the
// destination becomes one more backup of the chunk (its primary fills it while serving on), then the chunk
// leaves the source (a primary source hands over to the destination).
#ifndef TESSERA_SCHEDULER_MEMBERSHIP_CHUNK_MOVES_H_
#define TESSERA_SCHEDULER_MEMBERSHIP_CHUNK_MOVES_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/cluster.pb.h"

namespace tessera {

struct ChunkMove {
  std::string param;
  int index = 0;
  int from = 0;
  int to = 0;
};

// The moves that empty `server` of every copy it holds in `map` (its `servers` are the alive ones), each to the
// alive server holding no copy of that chunk with the fewest bytes of copies. FAILED_PRECONDITION when a chunk
// has no such server.
[[nodiscard]] absl::StatusOr<std::vector<ChunkMove>> DrainMoves(const tessera::v1::ShardMap& map, int server);

// The moves that give `server` (alive, holding nothing) a share of primaries: the largest primaries of the most
// loaded servers while a move narrows the gap.
std::vector<ChunkMove> ShareMoves(const tessera::v1::ShardMap& map, int server);

// Phase 1 on `placement`: `to` becomes a backup of each moved chunk. FAILED_PRECONDITION when a chunk is not in
// `placement` or `alive(to)` is false; `placement` may then be partly changed (the caller keeps a copy).
[[nodiscard]] absl::Status AddMoveDestinations(const std::vector<ChunkMove>& moves,
                                               const std::function<bool(int server)>& alive,
                                               tessera::v1::ShardMap& placement);

// Phase 2 on `placement`: each chunk leaves `from` (a primary `from` is replaced by `to`, which leaves the
// backups). Returns the moved chunks as they are now; FAILED_PRECONDITION for a chunk not in `placement`.
[[nodiscard]] absl::StatusOr<std::vector<tessera::v1::ChunkPlacement>> RemoveMoveSources(
    const std::vector<ChunkMove>& moves, tessera::v1::ShardMap& placement);

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_MEMBERSHIP_CHUNK_MOVES_H_
