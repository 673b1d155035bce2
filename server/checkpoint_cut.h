// A checkpoint of a server's chunks all at one SYNC round (RoundLocked: the clock their values belong to): a
// consistent cut taken while the scheduler holds the workers at that clock. Each chunk is taken the moment it
// reaches the round (by the round that closes into it, or at once when it is there already), so the workers need
// not stop for it. Module state (Chunk::module_state) has no rounds: it is taken as it is once every other chunk of
// the server is in, so it holds what the held workers wrote before the round's gradients (with the script's
// optimizer in SYNC, the keeper's values of the step before the cut's clock).
#ifndef TESSERA_SERVER_CHECKPOINT_CUT_H_
#define TESSERA_SERVER_CHECKPOINT_CUT_H_

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/checkpoint.pb.h"
#include "server/tables/chunk.h"

namespace tessera {

// Thread-safe. One cut at a time.
class CheckpointCut {
 public:
  // Takes `chunks` (never freed while the cut runs) at `version`: those already there now, the others as they
  // arrive (OfferLocked). Waits until every chunk is taken, `deadline` passes (DEADLINE_EXCEEDED naming some of
  // those missing) or `cancelled` (asked every 100 ms) says so (CANCELLED). FAILED_PRECONDITION for a chunk
  // already past the version. `server_id` names this server in errors.
  absl::StatusOr<std::vector<tessera::v1::ChunkState>> Take(const std::vector<Chunk*>& chunks, int64_t version,
                                                            absl::Time deadline,
                                                            const std::function<bool()>& cancelled, int server_id);

  // Called by whoever advances a chunk's version, under its lock: takes the chunk when a cut waits for this
  // version.
  void OfferLocked(const Chunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

 private:
  // Waits until `rounds` chunks are taken, the deadline passes (DEADLINE_EXCEEDED naming some of `chunks`
  // missing) or `cancelled` says so.
  absl::Status AwaitRounds(const std::vector<Chunk*>& chunks, size_t rounds, absl::Time deadline,
                           const std::function<bool()>& cancelled, int server_id) ABSL_LOCKS_EXCLUDED(mu_);
  std::atomic<int64_t> version_{-1};  // -1: no cut running
  absl::Mutex mu_;
  std::map<std::pair<std::string, int>, tessera::v1::ChunkState> taken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_CHECKPOINT_CUT_H_
