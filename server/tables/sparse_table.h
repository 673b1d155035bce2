// The sparse kind of table: embedding tables (ParameterSpec.embedding), rows of `dim` floats keyed by 64-bit
// ids. A table is cut into hash slots (common/model/shard_map.h EmbeddingSlot); a slot is the unit the view places,
// replicates, checkpoints and moves, and holds its rows in a hash map from id to a row of a block of rows.
//
// A row is created by the first gradient that reaches it (or, with EmbeddingSpec.admit_after = k, by the k-th
// one: the gradients before are dropped and counted, and the id reads zeros until then). A row never created
// reads its initial values, which are a pure function of the id (FillRowInit), so reading creates nothing and
// a backup, a checkpoint or a move never has to carry a row nobody trained. A row no gradient reached for
// EmbeddingSpec.expire_after_steps clocks is removed. A slot applies one (worker, seq) once.
//
// Memory: every row created takes RowBytes() from the server's row budget (RowMemory), and a push that would go
// beyond it is refused whole, RESOURCE_EXHAUSTED, changing nothing; or, for a table with evict_when_full, first
// evicts as many rows of its slots, the least recently updated.
#ifndef TESSERA_SERVER_TABLES_SPARSE_TABLE_H_
#define TESSERA_SERVER_TABLES_SPARSE_TABLE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/staleness_histogram.h"
#include "proto/tensor.pb.h"
#include "server/tables/held_units.h"
#include "server/tables/row_optimizer.h"
#include "server/tables/table.h"

namespace tessera {

// What one table's slots share, fixed by its declaration.
struct RowTableSpec {
  std::string name;
  int64_t dim = 0;
  int slots = 0;
  tessera::v1::InitSpec init;
  RowOptimizerSpec optimizer_spec;
  int64_t state_floats = 0;  // optimizer state per row
  int admit_after = 0;       // 0, 1: the first gradient creates a row
  int64_t expire_after = 0;  // clocks; 0: never
  bool evict_when_full = false;
  bool counts_steps = false;  // the optimizer needs each row's update count (lazy Adam)
  // Each row keeps the slot's version after its last change (4 bytes), for delta checkpoints: only in jobs that
  // write them (checkpoint.full_every > 1).
  bool tracks_versions = false;

  // Each row's newest clock is kept (for expiry or eviction).
  bool tracks_clocks() const { return expire_after > 0 || evict_when_full; }
  int64_t stride() const { return dim + state_floats; }
  // What one row takes in memory: values, state, its entry in the slot's index, and its bookkeeping.
  int64_t RowBytes() const;
};

// The rows' optimizer spec from a declaration, defaults filled in; INVALID_ARGUMENT naming the field.
absl::StatusOr<RowOptimizerSpec> RowOptimizerFromProto(const tessera::v1::RowOptimizerSpec& spec);
// The table's spec from a checked declaration (common/model/shard_map.h CheckEmbeddingSpec); `delta_checkpoints`: the
// job writes delta checkpoints, so rows keep their versions.
absl::StatusOr<std::shared_ptr<const RowTableSpec>> RowTableFromDeclaration(const tessera::v1::ParameterSpec& param,
                                                                            bool delta_checkpoints);

// A slot's state from a full checkpoint's (`full`) and a later delta checkpoint's (`delta`, ChunkState.delta):
// every row of delta.all_row_ids, from the delta when it holds the row, else from the full one; the rest of the
// state (version, sequence numbers, pending ids, clock) from the delta. FAILED_PRECONDITION when the delta is over
// another version than the full state's, or names a row neither holds; INVALID_ARGUMENT for sizes that do not fit.
absl::StatusOr<tessera::v1::ChunkState> ApplyRowDelta(const tessera::v1::ChunkState& full,
                                                      const tessera::v1::ChunkState& delta);

// The initial values of row `id` of table `name` (a pure function of init's seed, the name and the id).
void FillRowInit(const tessera::v1::InitSpec& init, std::string_view name, uint64_t id, absl::Span<float> out);

// The bytes of rows a server may hold, over all its embedding tables. Thread-safe.
class RowMemory {
 public:
  explicit RowMemory(int64_t cap_bytes) : cap_(cap_bytes) {}
  // Takes `bytes` from the budget: false (taking nothing) when it would go beyond the cap. 0: no cap.
  bool Reserve(int64_t bytes);
  void Release(int64_t bytes) { used_ -= bytes; }
  // Takes `bytes` whatever the cap (rows a server must hold: a primary's, a checkpoint's).
  void Charge(int64_t bytes) { used_ += bytes; }
  int64_t used() const { return used_.load(); }
  int64_t cap() const { return cap_; }

 private:
  const int64_t cap_;
  std::atomic<int64_t> used_{0};
};

// What one push did to a slot.
struct RowsApplied {
  int64_t updated = 0;
  int64_t refused = 0;  // not admitted yet
  int64_t created = 0;
  int64_t expired = 0;
  int64_t evicted = 0;
  std::vector<uint64_t> refused_ids;  // the ids of `refused`, in the order applied
};

// One hash slot of an embedding table.
struct RowSlot final : Unit {
  RowSlot(std::shared_ptr<const RowTableSpec> spec, int index, RowMemory* memory);
  ~RowSlot() override;

  const std::shared_ptr<const RowTableSpec> spec;
  RowMemory* const memory;  // not owned

  // Row `id`'s values into `out` (dim floats): its own, its initial ones when it was never created, zeros while
  // it waits for admission.
  void ReadLocked(uint64_t id, absl::Span<float> out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Rows among `ids` this slot would create if a gradient reached them now.
  int64_t NewRowsLocked(absl::Span<const uint64_t> ids) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The `count` rows whose newest gradient is oldest, none of `keep` (ascending): what an evicting push removes.
  std::vector<uint64_t> OldestRowsLocked(int64_t count, absl::Span<const uint64_t> keep) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Removes the rows of `evict` (their bytes back to the budget), then applies `grads` (ids.size() rows of dim,
  // finite, each id once) at `clock`, the learning rate scaled by `lr_scale`; rows it creates take their bytes
  // from `reserved` (which the caller took from the budget; what is left is the caller's to release), or beyond
  // it are charged whatever the cap. Advances the version and, with backups, logs the update.
  RowsApplied ApplyLocked(absl::Span<const uint64_t> ids, absl::Span<const float> grads, float lr_scale, int64_t clock,
                          int64_t& reserved, absl::Span<const uint64_t> evict = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  int64_t rows() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return static_cast<int64_t>(index_.size()); }
  int64_t pending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return static_cast<int64_t>(pending_.size()); }
  // Drops every row (their bytes back to the budget): the slot left this server.
  void ClearLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // What the slot takes in memory now (blocks, index, bookkeeping).
  int64_t MemoryBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  std::map<int, uint64_t> last_seq ABSL_GUARDED_BY(mu);  // per worker id: the newest push applied
  int64_t clock ABSL_GUARDED_BY(mu) = 0;                 // the newest clock a gradient carried
  // Counters for the table's statistics.
  mutable int64_t rows_pulled ABSL_GUARDED_BY(mu) = 0;
  int64_t rows_updated ABSL_GUARDED_BY(mu) = 0;
  int64_t rows_created ABSL_GUARDED_BY(mu) = 0;
  int64_t rows_expired ABSL_GUARDED_BY(mu) = 0;
  int64_t rows_evicted ABSL_GUARDED_BY(mu) = 0;
  int64_t admission_refusals ABSL_GUARDED_BY(mu) = 0;
  StalenessHistogram staleness ABSL_GUARDED_BY(mu);  // TableStats.staleness, this slot's updates

  tessera::v1::ChunkState StateLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A delta checkpoint's state over a full one that held version `base_version` (ChunkState.delta).
  tessera::v1::ChunkState DeltaStateLocked(int64_t base_version) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  tessera::v1::ChunkState ReplicaStateLocked(bool values) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status TakeReplicaLocked(const UpdateRule& rule, const tessera::v1::ReplicateRequest& request,
                                 int workers) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status RestoreLocked(const tessera::v1::ChunkState& state, const std::vector<bool>& keep_seq,
                             std::vector<std::shared_ptr<ExchangeWaiter>>& dropped) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void RenewWorkerLocked(int worker, int64_t joined_clock) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    last_seq.erase(worker);
  }
  std::vector<std::shared_ptr<ExchangeWaiter>> TakeWaitersLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return {};  // a row push never waits for a round
  }

 private:
  static constexpr int64_t kBlockRows = 1024;

  // The index holds row numbers only (4 bytes each); a row's id is beside its values in the id blocks, and the
  // index hashes and compares through it, so a lookup by id needs no copy of the id in the index.
  struct IdKey {
    uint64_t id;
  };
  uint64_t IdOf(uint32_t row) const ABSL_NO_THREAD_SAFETY_ANALYSIS {  // under mu: called by the index
    return id_blocks_[row / kBlockRows][row % kBlockRows];
  }
  struct RowHash {
    using is_transparent = void;
    const RowSlot* slot;
    size_t operator()(uint32_t row) const { return absl::Hash<uint64_t>()(slot->IdOf(row)); }
    size_t operator()(IdKey key) const { return absl::Hash<uint64_t>()(key.id); }
  };
  struct RowEq {
    using is_transparent = void;
    const RowSlot* slot;
    bool operator()(uint32_t a, uint32_t b) const { return a == b; }
    bool operator()(IdKey key, uint32_t row) const { return slot->IdOf(row) == key.id; }
    bool operator()(uint32_t row, IdKey key) const { return slot->IdOf(row) == key.id; }
  };

  float* RowLocked(uint32_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return blocks_[row / kBlockRows].get() + (row % kBlockRows) * spec->stride();
  }
  const float* RowLocked(uint32_t row) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return blocks_[row / kBlockRows].get() + (row % kBlockRows) * spec->stride();
  }
  // A new row for `id` with its initial values and state (its bytes already taken from the budget).
  uint32_t CreateLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Removes the rows no gradient reached for spec->expire_after clocks before `clock`.
  int64_t ExpireLocked(int64_t clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Takes the rows of a checkpoint's or a primary's state (checked: sizes, order, finite values); the budget is
  // charged for them whatever the cap (they were held before).
  absl::Status TakeRowsLocked(const tessera::v1::ChunkState& state, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void LogLocked(absl::Span<const uint64_t> ids, absl::Span<const float> grads, float lr_scale, int64_t clock,
                 absl::Span<const uint64_t> evicted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The rows' state, whole (base_version < 0) or as a delta over `base_version`.
  tessera::v1::ChunkState RowsStateLocked(int64_t base_version) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Removes row `row` of `id` from the index (its memory back to the budget); the caller counts why.
  void RemoveLocked(uint32_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  const RowOptimizer optimizer_;
  std::vector<std::unique_ptr<float[]>> blocks_ ABSL_GUARDED_BY(mu);       // kBlockRows rows of stride() each
  std::vector<std::unique_ptr<uint64_t[]>> id_blocks_ ABSL_GUARDED_BY(mu);  // kBlockRows ids each
  absl::flat_hash_set<uint32_t, RowHash, RowEq> index_ ABSL_GUARDED_BY(mu){0, RowHash{this}, RowEq{this}};
  std::vector<uint32_t> steps_ ABSL_GUARDED_BY(mu);                     // row -> updates (counts_steps only)
  std::vector<uint32_t> row_versions_ ABSL_GUARDED_BY(mu);  // row -> the slot's version after its last change
  std::vector<int64_t> clocks_ ABSL_GUARDED_BY(mu);                     // row -> newest clock (tracks_clocks)
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu);                      // rows freed by expiry
  uint32_t next_row_ ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<uint64_t, uint32_t> pending_ ABSL_GUARDED_BY(mu);  // id -> gradients before admission
  int64_t last_sweep_ ABSL_GUARDED_BY(mu) = 0;
};

// Every embedding table of the job, as the slots the view places on this server.
class SparseTable final : public Table {
 public:
  explicit SparseTable(RowMemory* memory) : memory_(memory) {}

  std::string_view kind() const override { return "embedding"; }
  absl::StatusOr<std::vector<UnitPlacement>> Placements(const tessera::v1::ShardMap& map) const override;
  Unit* Find(const UnitKey& key, Role role) const override { return held_.Find(key, role); }
  std::vector<Unit*> Units(Role role) const override;
  absl::StatusOr<Unit*> Create(const UnitSettings& settings, const tessera::v1::ShardMap& map,
                               const UnitPlacement& placement, Role role, bool from_checkpoint) override;
  Unit* ChangeRole(const UnitKey& key, Role role) override { return held_.ChangeRole(key, role); }
  void Retire(const UnitKey& key, Role role) override;
  void AddStats(tessera::v1::ServerStats& stats) const override;

  RowSlot* FindSlot(const UnitKey& key, Role role = Role::kPrimary) const { return held_.Find(key, role); }
  // The declaration of table `name`, or nullptr.
  const RowTableSpec* Spec(const std::string& name) const;

 private:
  RowMemory* const memory_;
  std::map<std::string, std::shared_ptr<const RowTableSpec>> specs_;
  HeldUnits<RowSlot> held_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_TABLES_SPARSE_TABLE_H_
