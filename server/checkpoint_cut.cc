#include "server/checkpoint_cut.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {

void CheckpointCut::OfferLocked(const Chunk& chunk) {
  if (version_.load() != RoundLocked(chunk)) return;
  absl::MutexLock lock(&mu_);
  taken_.try_emplace(chunk.key, ChunkStateLocked(chunk));
}

absl::StatusOr<std::vector<tessera::v1::ChunkState>> CheckpointCut::Take(const std::vector<Chunk*>& chunks,
                                                                         int64_t version, absl::Time deadline,
                                                                         const std::function<bool()>& cancelled,
                                                                         int server_id) {
  {
    absl::MutexLock lock(&mu_);
    taken_.clear();
  }
  version_ = version;
  absl::Status status;
  std::vector<Chunk*> module_state;
  for (Chunk* chunk : chunks) {
    absl::MutexLock chunk_lock(&chunk->mu);
    if (chunk->module_state) {
      module_state.push_back(chunk);
      continue;
    }
    const int64_t round = RoundLocked(*chunk);
    if (round == version) OfferLocked(*chunk);
    if (round > version) {
      absl::MutexLock lock(&mu_);
      if (taken_.count(chunk->key) == 0) {
        status = absl::FailedPreconditionError(absl::StrCat("chunk ", chunk->key.first, "/", chunk->key.second,
                                                            " is at round ", round,
                                                            ", past the checkpoint's ", version));
      }
    }
  }
  if (status.ok()) status = AwaitRounds(chunks, chunks.size() - module_state.size(), deadline, cancelled, server_id);
  version_ = -1;
  // Module state has no rounds. It is taken once this server's chunks are all at the version: with the workers
  // held there, it is what they wrote before that round's gradients (a script's kept values, module buffers).
  for (Chunk* chunk : status.ok() ? module_state : std::vector<Chunk*>()) {
    absl::MutexLock chunk_lock(&chunk->mu);
    tessera::v1::ChunkState state = ChunkStateLocked(*chunk);
    absl::MutexLock lock(&mu_);
    taken_.try_emplace(chunk->key, std::move(state));
  }
  absl::MutexLock lock(&mu_);
  std::vector<tessera::v1::ChunkState> out;
  if (status.ok()) {
    for (auto& [key, state] : taken_) out.push_back(std::move(state));
  }
  taken_.clear();
  if (!status.ok()) return status;
  return out;
}

absl::Status CheckpointCut::AwaitRounds(const std::vector<Chunk*>& chunks, size_t rounds, absl::Time deadline,
                                        const std::function<bool()>& cancelled, int server_id) {
  absl::MutexLock lock(&mu_);
  auto complete = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return taken_.size() >= rounds; };
  while (absl::Now() < deadline) {
    if (mu_.AwaitWithDeadline(absl::Condition(&complete), std::min(deadline, absl::Now() + absl::Milliseconds(100)))) {
      return absl::OkStatus();
    }
    if (cancelled && cancelled()) return absl::CancelledError("the checkpoint was called off");
  }
  if (complete()) return absl::OkStatus();
  std::vector<std::string> missing;
  for (Chunk* chunk : chunks) {
    if (!chunk->module_state && taken_.count(chunk->key) == 0 && missing.size() < 5) {
      missing.push_back(absl::StrCat(chunk->key.first, "/", chunk->key.second));
    }
  }
  return absl::DeadlineExceededError(absl::StrCat("server ", server_id, ": ", rounds - taken_.size(),
                                                  " chunks did not reach version ", version_.load(),
                                                  " in time, e.g. ", absl::StrJoin(missing, ", ")));
}

}  // namespace tessera
