// Cutting parameters into chunks and placing chunks on servers; looking chunks up in a ShardMap.
//
// A dense parameter of n float32 elements is cut into ceil(4n / chunk_bytes) contiguous chunks of near-equal
// length (so none exceeds chunk_bytes), and chunks go, largest first, to the server holding the fewest bytes.
// One large tensor therefore spans servers and its chunks travel in parallel.
//
// With replication (ReplicationSpec.backups = K), each chunk also has up to K backups, each on a server holding
// no other copy of it, fewest bytes of copies first. When a primary is lost its first live backup takes over.
//
// An embedding table (ParameterSpec.embedding) is cut into its hash slots instead: slot s is a chunk of index s,
// offset 0 and length `dim` (one row's worth, the weight the movers balance by), and the slots of a new table go
// round the servers in id order. A row's id picks its slot (EmbeddingSlot), so a table trains across servers and
// moves, is replicated and checkpointed slot by slot.
#ifndef TESSERA_COMMON_MODEL_SHARD_MAP_H_
#define TESSERA_COMMON_MODEL_SHARD_MAP_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/cluster.pb.h"

namespace tessera {

// Adds `params` to `map`, leaving chunks already placed where they are, and advances `map.epoch`.
// `map.servers` must be filled in. Parameters already in the map must be declared identically
// (FAILED_PRECONDITION otherwise, naming the parameter and both shapes); when nothing is new the map is left
// untouched. INVALID_ARGUMENT on an empty name, a non-positive dimension or an unsupported dtype.
// New chunks get `backups` backups each (fewer when the map has too few servers).
[[nodiscard]] absl::Status PlaceParameters(const std::vector<tessera::v1::ParameterSpec>& params, int64_t chunk_bytes,
                                           tessera::v1::ShardMap& map, int backups = 0);

// Embedding tables: the slots of `spec` (EmbeddingSpec.slots, 64 when unset), and the slot of row `id`.
inline constexpr int kDefaultEmbeddingSlots = 64;
inline constexpr int kMaxEmbeddingSlots = 65536;
int EmbeddingSlots(const tessera::v1::ParameterSpec& spec);
int EmbeddingSlot(uint64_t id, int slots);
// An embedding table's declaration: shape [dim], slots within 1 .. kMaxEmbeddingSlots, admission and expiry not
// negative, the optimizer's numbers finite, not negative, betas below 1. INVALID_ARGUMENT naming the field.
[[nodiscard]] absl::Status CheckEmbeddingSpec(const tessera::v1::ParameterSpec& spec);

// A view from the wire (a server's assignment, or one a server brings back to a restarted scheduler), checked
// before anything is allocated from it: the job must be valid; every chunk of a declared parameter, within it, no
// longer than the job's chunk_bytes, with its copies on distinct servers of the job; every server and worker
// listed once and within the job; every size and number (epoch, incarnations, clocks, rollbacks, key sizes)
// within the limits of common/model/wire_limits.h. INVALID_ARGUMENT naming what is wrong.
[[nodiscard]] absl::Status ValidateShardMap(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job);

// What became of a lost server's chunks.
struct ChunkMoves {
  // The primary was lost and a backup on a live server took over: the chunk lives on at the same version.
  std::vector<tessera::v1::ChunkPlacement> promoted;
  // No live copy was left: placed anew on the least-loaded server (its state must come from a checkpoint).
  std::vector<tessera::v1::ChunkPlacement> moved;
};

// `from_server` is gone: it leaves every chunk's backups, and the chunks it was primary of go to their first
// backup on a server of `map.servers`, or, without one, to the other servers (largest first, least-loaded bytes
// first). Advances `map.epoch`. FAILED_PRECONDITION when a chunk has to move and the map has no other server.
[[nodiscard]] absl::StatusOr<ChunkMoves> MoveChunks(int from_server, tessera::v1::ShardMap& map);

// Gives every chunk with fewer than `backups` backups more, on servers of `map.servers` holding no copy of it
// (fewest bytes of copies first), while there are such servers. Returns the chunks given one, as they are now.
// Leaves the epoch to the caller.
std::vector<tessera::v1::ChunkPlacement> FillBackups(int backups, tessera::v1::ShardMap& map);

// Bytes each server id is primary of under `map`.
std::map<int, int64_t> BytesPerServer(const tessera::v1::ShardMap& map);

// Read-only index over a ShardMap. Thread-compatible.
class ShardMapIndex {
 public:
  explicit ShardMapIndex(tessera::v1::ShardMap map);

  const tessera::v1::ShardMap& map() const { return map_; }
  uint64_t epoch() const { return map_.epoch(); }

  // The parameter's declaration, or NOT_FOUND naming it.
  absl::StatusOr<const tessera::v1::ParameterSpec*> Param(const std::string& name) const;
  // The parameter's position in the map's list (the declaration order, which is the model's: first layer 0),
  // or NOT_FOUND.
  absl::StatusOr<int> ParamPosition(const std::string& name) const;
  // The parameter's chunks in offset order, or NOT_FOUND.
  absl::StatusOr<std::vector<const tessera::v1::ChunkPlacement*>> Chunks(const std::string& name) const;
  // The address of a server id, or NOT_FOUND.
  absl::StatusOr<std::string> ServerAddress(int server_id) const;
  // A server's entry, or NOT_FOUND.
  absl::StatusOr<const tessera::v1::ServerInfo*> Server(int server_id) const;

 private:
  tessera::v1::ShardMap map_;
  std::map<std::string, int> param_index_;
  std::map<std::string, std::vector<int>> chunks_by_param_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_MODEL_SHARD_MAP_H_
