#include "server/consistency/sync_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace tessera {

void SyncPolicy::PrepareChunkLocked(Chunk& chunk, int workers) const {
  chunk.round.Prepare(chunk.values.size(), workers, keeps_apart());
}

absl::StatusOr<Admission> SyncPolicy::AdmitLocked(const ChunkPush& push, absl::Span<const float> grad, Chunk& chunk,
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

void SyncPolicy::CollectLocked(const ChunkPush& push, absl::Span<const float> grad, Chunk& chunk, Admission&) {
  chunk.round.Add(push.worker_id, grad, push.batch_size, {push.lr_factor, push.skip});
}

bool SyncPolicy::RoundCompleteLocked(const Chunk& chunk, const Roster& roster) const {
  for (size_t w = 0; w < roster.active.size(); ++w) {
    if (roster.InRound(static_cast<int>(w), RoundLocked(chunk)) && !chunk.round.Has(static_cast<int>(w))) return false;
  }
  return true;
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

void BackupSyncPolicy::CollectLocked(const ChunkPush& push, absl::Span<const float> grad, Chunk& chunk,
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
