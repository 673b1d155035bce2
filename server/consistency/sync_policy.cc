#include "server/consistency/sync_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace tessera {

void SyncPolicy::PrepareChunkLocked(Chunk& chunk, int workers) const {
  chunk.round.Prepare(chunk.values.size(), workers, keeps_apart());
}

absl::StatusOr<Admission> SyncPolicy::AdmitLocked(const ChunkPush& push, const FloatPieces& grad, Chunk& chunk,
                                                  const Roster& roster, const std::string& what) {
  Admission admission;
  const int64_t round = RoundLocked(chunk);
  if (push.clock < round) {
    admission.late = true;  // the round closed without it; never mixed into a later round
    admission.after_close = true;
    return admission;
  }
  if (push.clock > round) {
    return absl::UnavailableError(
        absl::StrCat(what, ": round ", push.clock, " is not open yet; the chunk is collecting round ", round));
  }
  if (chunk.round.Has(push.worker_id)) {
    return absl::AbortedError(
        absl::StrCat(what, ": worker ", push.worker_id, " already pushed round ", round, " with another seq"));
  }
  CollectLocked(push, grad, chunk, admission);
  admission.staleness = std::max<int64_t>(0, push.clock - push.read_clock_version);
  if (RoundCompleteLocked(chunk, roster)) {
    admission.closed_waiters = CloseLocked(chunk, admission.dropped);
    admission.closed = true;
  } else {
    admission.round_open = true;
  }
  return admission;
}

bool SyncPolicy::CloseIfCompleteLocked(Chunk& chunk, const Roster& roster, int64_t& dropped,
                                       std::vector<std::shared_ptr<ExchangeWaiter>>& closed) {
  // Nothing collected yet: the round closes when its gradients arrive.
  if (!chunk.round.collecting() || !RoundCompleteLocked(chunk, roster)) return false;
  for (auto& w : CloseLocked(chunk, dropped)) closed.push_back(std::move(w));
  return true;
}

void SyncPolicy::CollectLocked(const ChunkPush& push, const FloatPieces& grad, Chunk& chunk, Admission&) {
  chunk.round.Add(push.worker_id, grad, push.batch_size, {push.lr_factor, push.skip});
}

namespace {

// Has every worker that round `round` waits for contributed to `collected`?
bool EveryoneInLocked(const SyncRound& collected, int64_t round, const Roster& roster) {
  for (size_t w = 0; w < roster.active.size(); ++w) {
    if (roster.InRound(static_cast<int>(w), round) && !collected.Has(static_cast<int>(w))) return false;
  }
  return true;
}

}  // namespace

bool SyncPolicy::RoundCompleteLocked(const Chunk& chunk, const Roster& roster) const {
  return EveryoneInLocked(chunk.round, RoundLocked(chunk), roster);
}

absl::StatusOr<Admission> SyncPolicy::AdmitNormLocked(const ChunkPush& push, const FloatPieces& grad,
                                                      Chunk& chunk, const Roster& roster, const std::string& what) {
  Admission admission;
  const int64_t round = RoundLocked(chunk);
  if (push.clock == chunk.norm_closed_round && push.clock == round) {
    admission.closed = true;  // a retry: the norm round closed already
    admission.round_sq_norm = chunk.norm_closed_sq;
    return admission;
  }
  if (push.clock < round) {
    return absl::AbortedError(absl::StrCat(what, ": the norm round of ", push.clock,
                                           " is over (its update was applied); the chunk is at round ", round));
  }
  if (push.clock > round) {
    return absl::UnavailableError(
        absl::StrCat(what, ": norm round ", push.clock, " is not open yet; the chunk is collecting round ", round));
  }
  if (!chunk.norm_round.Has(push.worker_id)) {
    // Sized on first use: only jobs that clip collect norm rounds.
    if (chunk.norm_round.sum().size() != grad.size()) chunk.norm_round.Prepare(grad.size(), 0, /*keep_apart=*/false);
    chunk.norm_round.Add(push.worker_id, grad, push.batch_size);
  }
  if (EveryoneInLocked(chunk.norm_round, round, roster)) {
    admission.closed_waiters = CloseNormLocked(chunk);
    admission.closed = true;
    admission.round_sq_norm = chunk.norm_closed_sq;
  } else {
    admission.round_open = true;
  }
  return admission;
}

bool SyncPolicy::CloseNormIfCompleteLocked(Chunk& chunk, const Roster& roster, double& sq_norm,
                                           std::vector<std::shared_ptr<ExchangeWaiter>>& closed) {
  if (!chunk.norm_round.collecting() || !EveryoneInLocked(chunk.norm_round, RoundLocked(chunk), roster)) {
    return false;
  }
  for (auto& w : CloseNormLocked(chunk)) closed.push_back(std::move(w));
  sq_norm = chunk.norm_closed_sq;
  return true;
}

std::vector<std::shared_ptr<ExchangeWaiter>> SyncPolicy::CloseNormLocked(Chunk& chunk) {
  // The squared norm of the batch-weighted mean, as the update round would form it.
  const double inv = 1.0 / chunk.norm_round.weight();
  double sq = 0;
  for (float s : chunk.norm_round.sum()) {
    const double mean = static_cast<double>(s) * inv;
    sq += mean * mean;
  }
  chunk.norm_closed_round = RoundLocked(chunk);
  chunk.norm_closed_sq = sq;
  return chunk.norm_round.Reset();
}

std::vector<std::shared_ptr<ExchangeWaiter>> SyncPolicy::CloseLocked(Chunk& chunk, int64_t&) {
  return ApplyRoundLocked(chunk);
}

std::vector<std::shared_ptr<ExchangeWaiter>> SyncPolicy::ApplyRoundLocked(Chunk& chunk) {
  const float inv = static_cast<float>(1.0 / chunk.round.weight());
  const int64_t round = RoundLocked(chunk);
  chunk.last_round_skipped = chunk.round.skip();
  if (chunk.round.skip()) {
    // A worker skipped its step (its gradient scaler found inf or NaN): every worker's values stay as they were.
    SkipUpdateLocked(chunk, chunk.round.workers(), round);
  } else if (!ApplyUpdateLocked(rule_, chunk, chunk.round.sum(), chunk.round.lr_factor(), inv, chunk.round.workers(),
                                round)) {
    // The round's mean would overflow the values: the round closes without an update, so nobody waits forever.
    LOG_EVERY_N(WARNING, 100) << "chunk " << chunk.key.first << "/" << chunk.key.second << ": round " << round
                              << "'s update would make values non-finite; left out";
    SkipUpdateLocked(chunk, chunk.round.workers(), round);
  }
  return chunk.round.Reset();
}

void BackupSyncPolicy::Decide(std::vector<std::pair<int64_t, std::vector<int>>> rounds) {
  absl::MutexLock lock(&mu_);
  for (auto& [round, members] : rounds) {
    std::sort(members.begin(), members.end());
    decided_[round] = std::make_shared<const std::vector<int>>(std::move(members));
  }
  while (decided_.size() > kDecidedRoundsKept) decided_.erase(decided_.begin());
}

std::shared_ptr<const std::vector<int>> BackupSyncPolicy::MembersOf(int64_t round) const {
  absl::MutexLock lock(&mu_);
  auto it = decided_.find(round);
  return it == decided_.end() ? nullptr : it->second;
}

void BackupSyncPolicy::CollectLocked(const ChunkPush& push, const FloatPieces& grad, Chunk& chunk,
                                     Admission& admission) {
  chunk.round.Keep(push.worker_id, grad, push.batch_size, {push.lr_factor, push.skip});
  std::shared_ptr<const std::vector<int>> members = MembersOf(RoundLocked(chunk));
  admission.late = members != nullptr && !std::binary_search(members->begin(), members->end(), push.worker_id);
}

bool BackupSyncPolicy::RoundCompleteLocked(const Chunk& chunk, const Roster& roster) const {
  const int64_t round = RoundLocked(chunk);
  std::shared_ptr<const std::vector<int>> members = MembersOf(round);
  if (members == nullptr) return false;
  for (int w : *members) {
    if (w < static_cast<int>(roster.active.size()) && roster.InRound(w, round) && !chunk.round.Has(w)) {
      return false;
    }
  }
  return true;
}

std::vector<std::shared_ptr<ExchangeWaiter>> BackupSyncPolicy::CloseLocked(Chunk& chunk, int64_t& dropped) {
  // The members' gradients, weighted by batch size, make the round; everyone else's are late.
  const int64_t round = RoundLocked(chunk);
  std::shared_ptr<const std::vector<int>> members = MembersOf(round);
  dropped += chunk.round.Sum(members.get());
  // The round is over for everyone: a late worker's gradient of it never comes in, so it holds nobody's
  // staleness back (clock_version).
  for (int64_t& applied : chunk.applied_clocks) applied = std::max(applied, round + 1);
  if (chunk.round.workers().empty()) {
    SkipUpdateLocked(chunk, {}, round);  // every member left the job: the round closes with no update
    chunk.last_round_skipped = false;
    return chunk.round.Reset();
  }
  return ApplyRoundLocked(chunk);
}

}  // namespace tessera
