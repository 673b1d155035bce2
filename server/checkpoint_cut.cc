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
  for (Chunk* chunk : chunks) {
    absl::MutexLock chunk_lock(&chunk->mu);
    const int64_t round = RoundLocked(*chunk);
    if (chunk->module_state) {  // module state has no rounds: its value now
      absl::MutexLock lock(&mu_);
      taken_.try_emplace(chunk->key, ChunkStateLocked(*chunk));
      continue;
    }
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
  absl::MutexLock lock(&mu_);
  if (status.ok()) {
    auto complete = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return taken_.size() >= chunks.size(); };
    bool done = false;
    while (!done && absl::Now() < deadline && status.ok()) {
      done = mu_.AwaitWithDeadline(absl::Condition(&complete), std::min(deadline, absl::Now() + absl::Milliseconds(100)));
      if (!done && cancelled && cancelled()) status = absl::CancelledError("the checkpoint was called off");
    }
    if (status.ok() && !done) {
      std::vector<std::string> missing;
      for (Chunk* chunk : chunks) {
        if (taken_.count(chunk->key) == 0 && missing.size() < 5) {
          missing.push_back(absl::StrCat(chunk->key.first, "/", chunk->key.second));
        }
      }
      status = absl::DeadlineExceededError(absl::StrCat("server ", server_id, ": ", chunks.size() - taken_.size(),
                                                        " chunks did not reach version ", version,
                                                        " in time, e.g. ", absl::StrJoin(missing, ", ")));
    }
  }
  version_ = -1;
  std::vector<tessera::v1::ChunkState> out;
  if (status.ok()) {
    for (auto& [key, state] : taken_) out.push_back(std::move(state));
  }
  taken_.clear();
  if (!status.ok()) return status;
  return out;
}

}  // namespace tessera
