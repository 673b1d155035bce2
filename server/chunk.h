// One chunk of a parameter as a server holds it, the view's workers it is updated by, and the operations on a
// chunk that every consistency mode shares: applying an update (undone when it would overflow), the clock
// version staleness is measured against, and the state a checkpoint saves and restores.
//
// Every function here runs under the chunk's lock; ShardStore takes it.
#ifndef TESSERA_SERVER_CHUNK_H_
#define TESSERA_SERVER_CHUNK_H_

#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/update_rule.h"
#include "proto/checkpoint.pb.h"
#include "proto/ps.pb.h"
#include "server/sync_round.h"

namespace tessera {

// The view's workers, as of the last view a server adopted. Immutable once published.
struct Roster {
  std::vector<bool> active;
  std::vector<uint64_t> incarnation;
  std::vector<int64_t> joined_clock;
  std::vector<std::string> key_digest;  // SHA-256 of each worker's member key; empty: not checked
  // The round rule: does sync round `round` wait for `worker`? (The scheduler's clock gate asks the same of
  // the view it publishes; see scheduler/cluster_view.h.)
  bool InRound(int worker, int64_t round) const { return active[worker] && joined_clock[worker] <= round; }
};

// Replication (ReplicationSpec). On the chunk's primary: its backups in the adopted view, the newest version every
// one of them holds, and the callers waiting for their update to reach them. On a backup: whose state it holds.
struct ChunkReplication {
  std::vector<int> backups;          // server ids
  uint64_t generation = 0;           // grows with every change of `backups`
  int64_t replicated_version = -1;   // every backup holds this version; -1: not known (hand the state over)
  // The updates applied since version `log_base`, in order: what the next hand-over carries instead of the whole
  // state while the backups hold `log_base` or later. -1: not kept (the next hand-over is the whole state, and
  // the log starts from it); dropped when it would be larger than the state.
  int64_t log_base = -1;
  std::vector<tessera::v1::ChunkUpdate> log;
  size_t log_bytes = 0;
  bool shipping = false;             // a hand-over to the backups is on its way
  std::vector<std::pair<int64_t, std::function<void(absl::Status)>>> waiting;  // (version, done)
  // On a backup: the primary the view names, and the view epoch of the last state taken from a primary.
  int primary = -1;
  uint64_t taken_epoch = 0;
  // On a backup: it has taken a state or updates from a primary (a copy made by this server alone holds only
  // the initial values). A view that makes an unfilled copy the primary leaves the chunk without its state.
  bool filled = false;
  // Promoted before it was filled: the chunk's state is lost on this server, and every request for it says so.
  bool lost = false;
};

struct Chunk {
  Chunk(std::string param, int index, int64_t length, int state_slots)
      : key(std::move(param), index), values(length), state(length * state_slots) {}

  const std::pair<std::string, int> key;  // parameter, chunk index
  bool module_state = false;                // ParameterSpec.state: assigned only, no rounds; set at creation
  mutable absl::Mutex mu;
  std::vector<float> values ABSL_GUARDED_BY(mu);
  std::vector<float> state ABSL_GUARDED_BY(mu);
  int64_t version ABSL_GUARDED_BY(mu) = 0;           // updates applied, assignments included
  int64_t assignments ABSL_GUARDED_BY(mu) = 0;       // ASSIGN pushes applied (initial values, restores)
  int64_t gradient_updates ABSL_GUARDED_BY(mu) = 0;  // optimizer steps taken (Adam's t)
  // The largest |value| and |state| after the last update (infinity: not known yet, e.g. after a restore).
  float values_bound ABSL_GUARDED_BY(mu) = std::numeric_limits<float>::infinity();
  float state_bound ABSL_GUARDED_BY(mu) = std::numeric_limits<float>::infinity();
  std::map<int, uint64_t> last_seq ABSL_GUARDED_BY(mu);     // per worker id: the newest push applied
  std::vector<int64_t> applied_clocks ABSL_GUARDED_BY(mu);  // per worker id
  SyncRound round ABSL_GUARDED_BY(mu);                      // SYNC only: the round being collected
  bool last_round_skipped ABSL_GUARDED_BY(mu) = false;     // SYNC: the newest round closed without an update
  // SYNC with optimizer.clip_global_norm: the norm round of the round being collected (PushRequest.norm_only),
  // and the newest one closed (its round, and the squared norm of its mean), which answers a retried push again.
  SyncRound norm_round ABSL_GUARDED_BY(mu);
  int64_t norm_closed_round ABSL_GUARDED_BY(mu) = -1;
  double norm_closed_sq ABSL_GUARDED_BY(mu) = 0;
  ChunkReplication replication ABSL_GUARDED_BY(mu);
};

// The SYNC round the chunk collects: one per update but assignments (an ASSIGN push, e.g. a worker's initial
// values, sets values without being a round). Also the clock the chunk's values belong to in SYNC.
inline int64_t RoundLocked(const Chunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu) {
  return chunk.version - chunk.assignments;
}

// Applies `grad` (already validated) to `chunk` with `rule`, advancing its version and the clocks of `workers`
// to `clock` + 1. An update that would leave a value or optimizer state non-finite (finite gradients can still
// overflow: a huge one, or a diverging job) is undone: false, and the chunk is as it was.
[[nodiscard]] bool ApplyUpdateLocked(const UpdateRule& rule, Chunk& chunk, absl::Span<const float> grad,
                                     float lr_scale, float grad_scale, const std::vector<int>& workers, int64_t clock)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

// Closes a SYNC round of `clock` without an update (a worker skipped its step, or the update would have
// overflowed): the version and the clocks of `workers` advance, the values and the optimizer's state (Adam's t
// too) stay, and the backups are told the same.
void SkipUpdateLocked(Chunk& chunk, const std::vector<int>& workers, int64_t clock)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

// Hands over the exchanges waiting on the chunk's round and on its norm round, leaving both rounds as they are
// (shutdown, a chunk moved away or handed to another role).
std::vector<std::shared_ptr<ExchangeWaiter>> TakeWaitersLocked(Chunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

// The smallest clock of the active workers' updates in the chunk (workers that left hold nobody back).
int64_t ClockVersionLocked(const Chunk& chunk, const Roster& roster) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

// The chunk's state as a checkpoint holds it.
tessera::v1::ChunkState ChunkStateLocked(const Chunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

// The chunk's state as its backups take it: as ChunkStateLocked, but the sequence table holds only applied
// pushes (SYNC: not those of the round still open, which a backup taking over collects again when they are
// retried); without `values`, the values and optimizer state are left out.
tessera::v1::ChunkState ReplicaStateLocked(const Chunk& chunk, bool values = true)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

// Notes an update just applied to a chunk that has backups, for the next hand-over (`values`: the gradient the
// rule took, or the values assigned).
void LogUpdateLocked(Chunk& chunk, bool assign, absl::Span<const float> values, float lr_scale, float grad_scale,
                     const std::vector<int>& workers, int64_t clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

// A backup applies `updates` (from its primary, in order; the first must follow the chunk's version) with `rule`,
// then takes the clocks, counters and sequence table of `after`. FAILED_PRECONDITION, changing nothing, when they
// do not follow the chunk's version (the primary then sends the whole state); INVALID_ARGUMENT for an update of
// another size or with non-finite values.
[[nodiscard]] absl::Status ApplyReplicatedLocked(const UpdateRule& rule,
                                                 const google::protobuf::RepeatedPtrField<tessera::v1::ChunkUpdate>& updates,
                                                 const tessera::v1::ChunkState& after, Chunk& chunk)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

// Takes the chunk's state from a checkpoint (the sizes must match; checked by the caller). Sequence tables are
// kept only for worker ids with `keep_seq`. The open round is dropped; its exchanges are moved to `dropped`.
void RestoreChunkLocked(const tessera::v1::ChunkState& state, const std::vector<bool>& keep_seq, Chunk& chunk,
                        std::vector<std::shared_ptr<ExchangeWaiter>>& dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

}  // namespace tessera

#endif  // TESSERA_SERVER_CHUNK_H_
