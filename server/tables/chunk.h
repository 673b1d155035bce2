// One chunk of a parameter as a server holds it, the view's workers it is updated by, and the operations on a
// chunk that every consistency mode shares: applying an update (undone when it would overflow), the clock
// version staleness is measured against, and the state a checkpoint saves and restores.
//
// Every function here runs under the chunk's lock; the store takes it.
#ifndef TESSERA_SERVER_TABLES_CHUNK_H_
#define TESSERA_SERVER_TABLES_CHUNK_H_

#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/base/float_pieces.h"
#include "common/model/update_rule.h"
#include "proto/checkpoint.pb.h"
#include "proto/ps.pb.h"
#include "server/tables/sync_round.h"
#include "server/tables/table.h"

namespace tessera {

// The view's workers, as of the last view a server adopted. Immutable once published.
struct Roster {
  std::vector<bool> active;
  std::vector<uint64_t> incarnation;
  std::vector<int64_t> joined_clock;
  std::vector<std::string> key_digest;  // SHA-256 of each worker's member key; empty: not checked
  // The round rule: does sync round `round` wait for `worker`? (The scheduler's clock gate asks the same of
  // the view it publishes; see scheduler/membership/cluster_view.h.)
  bool InRound(int worker, int64_t round) const { return active[worker] && joined_clock[worker] <= round; }
};

// A dense table's unit (tables/dense_table.h): a contiguous slice of one parameter.
struct Chunk final : Unit {
  Chunk(std::string param, int index, int64_t length, int state_slots)
      : Unit(std::move(param), index), values(length), state(length * state_slots) {}

  bool module_state = false;                // ParameterSpec.state: assigned only, no rounds; set at creation
  std::vector<float> values ABSL_GUARDED_BY(mu);
  std::vector<float> state ABSL_GUARDED_BY(mu);
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
  // ASYNC and SSP with delay compensation (ConsistencySpec.delay_compensation): per worker id, the values it last
  // read from this chunk and their version (-1 and empty: none since it joined, or since a restore).
  std::vector<std::vector<float>> read_values ABSL_GUARDED_BY(mu);
  std::vector<int64_t> read_version ABSL_GUARDED_BY(mu);

  tessera::v1::ChunkState StateLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  tessera::v1::ChunkState ReplicaStateLocked(bool values) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status TakeReplicaLocked(const UpdateRule& rule, const tessera::v1::ReplicateRequest& request,
                                 int workers) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status RestoreLocked(const tessera::v1::ChunkState& state, const std::vector<bool>& keep_seq,
                             std::vector<std::shared_ptr<ExchangeWaiter>>& dropped) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void RenewWorkerLocked(int worker, int64_t joined_clock) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::vector<std::shared_ptr<ExchangeWaiter>> TakeWaitersLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

// The SYNC round the chunk collects: one per update but assignments (an ASSIGN push, e.g. a worker's initial
// values, sets values without being a round). Also the clock the chunk's values belong to in SYNC.
inline int64_t RoundLocked(const Chunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu) {
  return chunk.version - chunk.assignments;
}

// Applies `grad` (already validated) to `chunk` with `rule`, advancing its version and the clocks of `workers`
// to `clock` + 1. An update that would leave a value or optimizer state non-finite (finite gradients can still
// overflow: a huge one, or a diverging job) is undone: false, and the chunk is as it was.
[[nodiscard]] bool ApplyUpdateLocked(const UpdateRule& rule, Chunk& chunk, const FloatPieces& grad,
                                     float lr_scale, float grad_scale, const std::vector<int>& workers, int64_t clock)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

// Closes a SYNC round of `clock` without an update (a worker skipped its step, or the update would have
// overflowed): the version and the clocks of `workers` advance, the values and the optimizer's state (Adam's t
// too) stay, and the backups are told the same.
void SkipUpdateLocked(Chunk& chunk, const std::vector<int>& workers, int64_t clock)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

// Delay compensation: `worker` no longer holds values the chunk knows (it rejoined, or the chunk was restored).
void ForgetReadLocked(Chunk& chunk, int worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

// The smallest clock of the active workers' updates in the chunk (workers that left hold nobody back).
int64_t ClockVersionLocked(const Chunk& chunk, const Roster& roster) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

// The chunk's state as a checkpoint holds it.
tessera::v1::ChunkState ChunkStateLocked(const Chunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

// Notes an update just applied to a chunk that has backups, for the next hand-over (`values`: the gradient the
// rule took, or the values assigned).
void LogUpdateLocked(Chunk& chunk, bool assign, const FloatPieces& values, float lr_scale, float grad_scale,
                     const std::vector<int>& workers, int64_t clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

}  // namespace tessera

#endif  // TESSERA_SERVER_TABLES_CHUNK_H_
