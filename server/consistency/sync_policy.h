// SYNC on a server, with and without backup workers (see policy.h).
#ifndef TESSERA_SERVER_CONSISTENCY_SYNC_POLICY_H_
#define TESSERA_SERVER_CONSISTENCY_SYNC_POLICY_H_

#include <map>

#include "absl/synchronization/mutex.h"
#include "server/consistency/policy.h"

namespace tessera {

// Every worker the round rule (Roster::InRound) names for a round contributes to it.
class SyncPolicy : public ConsistencyPolicy {
 public:
  // `decided`: backup workers (BackupSyncPolicy), whose rounds the scheduler decides.
  explicit SyncPolicy(const UpdateRule& rule, bool decided = false)
      : rule_(rule), rows_(decided, [this](int64_t round) { return RowMembers(round); }) {}

  void PrepareChunkLocked(Chunk& chunk, int workers) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  absl::StatusOr<Admission> AdmitLocked(const ChunkPush& push, const FloatPieces& grad, Chunk& chunk,
                                        const Roster& roster, const std::string& what) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  bool DuplicateWaitsLocked(const ChunkPush& push, const Chunk& chunk) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu) {
    return push.clock == RoundLocked(chunk);
  }
  bool CloseIfCompleteLocked(Chunk& chunk, const Roster& roster, int64_t& dropped,
                             std::vector<std::shared_ptr<ExchangeWaiter>>& closed) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  absl::StatusOr<Admission> AdmitNormLocked(const ChunkPush& push, const FloatPieces& grad, Chunk& chunk,
                                            const Roster& roster, const std::string& what) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  bool CloseNormIfCompleteLocked(Chunk& chunk, const Roster& roster, double& sq_norm,
                                 std::vector<std::shared_ptr<ExchangeWaiter>>& closed) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

  void AdmitRows(RowPush push, RowAnswer done, const Roster& roster, const RowApplier& apply,
                 RowsTaken& taken) override {
    rows_.Admit(std::move(push), std::move(done), roster, apply, taken);
  }
  void CloseRowRounds(const Roster& roster, const RowApplier& apply, RowsTaken& taken) override {
    rows_.CloseComplete(roster, apply, taken);
  }
  absl::StatusOr<bool> ParkRowPull(const std::string& table, int64_t clock, std::function<void()> retry) override {
    return rows_.ParkPull(table, clock, std::move(retry));
  }
  void DropRowRounds(const std::function<bool(RowSlot&)>& gone, const absl::Status& why, bool forget,
                     RowsTaken& taken) override {
    rows_.Drop(gone, why, forget, taken);
  }
  void CancelRowRounds(const absl::Status& why, RowsTaken& taken) override { rows_.Cancel(why, taken); }

 protected:
  virtual bool keeps_apart() const { return false; }
  // The members of a decided round (backup workers), or null.
  virtual std::shared_ptr<const std::vector<int>> RowMembers(int64_t round) const { return nullptr; }
  // Puts a checked gradient of the open round into it; sets `late` when it will not count.
  virtual void CollectLocked(const ChunkPush& push, const FloatPieces& grad, Chunk& chunk, Admission& admission)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // Has every worker the round waits for contributed?
  virtual bool RoundCompleteLocked(const Chunk& chunk, const Roster& roster) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // Applies the complete round and returns the exchanges that waited for it; `dropped` counts gradients left out.
  virtual std::vector<std::shared_ptr<ExchangeWaiter>> CloseLocked(Chunk& chunk, int64_t& dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // Closes the complete norm round: its squared norm is kept for retries; returns the exchanges that waited.
  std::vector<std::shared_ptr<ExchangeWaiter>> CloseNormLocked(Chunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // Applies the round's weighted mean and starts the next round.
  std::vector<std::shared_ptr<ExchangeWaiter>> ApplyRoundLocked(Chunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

  const UpdateRule& rule_;
  RowRounds rows_;  // the rows' rounds, one per table
};

// The scheduler names each round's members (the first workers to finish it); the rest are backups.
class BackupSyncPolicy final : public SyncPolicy {
 public:
  explicit BackupSyncPolicy(const UpdateRule& rule) : SyncPolicy(rule, /*decided=*/true) {}

  void Decide(std::vector<std::pair<int64_t, std::vector<int>>> rounds) override;
  bool decides_rounds() const override { return true; }

 protected:
  bool keeps_apart() const override { return true; }
  void CollectLocked(const ChunkPush& push, const FloatPieces& grad, Chunk& chunk, Admission& admission) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  bool RoundCompleteLocked(const Chunk& chunk, const Roster& roster) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  std::vector<std::shared_ptr<ExchangeWaiter>> CloseLocked(Chunk& chunk, int64_t& dropped) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  std::shared_ptr<const std::vector<int>> RowMembers(int64_t round) const override { return MembersOf(round); }

 private:
  // The members of `round` (ascending), or null while undecided.
  std::shared_ptr<const std::vector<int>> MembersOf(int64_t round) const ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  std::map<int64_t, std::shared_ptr<const std::vector<int>>> decided_ ABSL_GUARDED_BY(mu_);  // the newest kept
};

}  // namespace tessera

#endif  // TESSERA_SERVER_CONSISTENCY_SYNC_POLICY_H_
