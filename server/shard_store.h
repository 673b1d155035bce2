// The chunks one server owns, and the consistency rules that govern their updates. Transport-free.
//
// Every request carries the shard-map epoch its sender holds. A request for an older epoch fails with
// FAILED_PRECONDITION carrying the store's epoch (see GetCurrentEpoch in common/status_macros.h); one for a newer
// epoch fails with UNAVAILABLE (the assignment is still on its way: retry).
//
// Consistency, set by the job:
//   SYNC   a chunk collects one gradient per worker for its current round (= its version); the last to arrive
//          applies the batch-size-weighted mean once. A push for a closed round is counted as late and ignored.
//   ASYNC  each gradient is applied on arrival.
//   SSP    applied like ASYNC; the scheduler's clock gate bounds how far workers drift apart.
// In every mode a push is applied at most once per (worker id, seq): a retried push answers `duplicate`.
//
// Staleness of a gradient = its clock minus the chunk's clock_version when the gradient's values were read
// (read_clock_version): how many clocks of some worker's updates it did not see. clock_version is the smallest
// count of clocks any worker of the job has had applied to the chunk.
#ifndef TESSERA_SERVER_SHARD_STORE_H_
#define TESSERA_SERVER_SHARD_STORE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/staleness_histogram.h"
#include "proto/cluster.pb.h"
#include "proto/ps.pb.h"
#include "server/update_rule.h"

namespace tessera {

// Thread-safe. Pushes to different chunks run in parallel; pushes to one chunk are serialised.
class ShardStore {
 public:
  ShardStore() = default;

  ShardStore(const ShardStore&) = delete;
  ShardStore& operator=(const ShardStore&) = delete;

  // Adopts `map` (which must be newer than the current one) and the job: creates and initialises the chunks
  // placed on server `server_id` (this one) that it does not hold yet. INVALID_ARGUMENT on a job or map it cannot
  // use; FAILED_PRECONDITION when a different job or id is already assigned or the map is older.
  [[nodiscard]] absl::Status Assign(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job,
                                    int server_id);

  // The chunk's value (no bytes when `have_version` is current). NOT_FOUND for a chunk not on this server.
  [[nodiscard]] absl::StatusOr<tessera::v1::PullResponse> Pull(const tessera::v1::PullRequest& request) const;

  // Applies (or, in SYNC, collects) a gradient, or assigns values. INVALID_ARGUMENT for a wrong byte length or a
  // non-finite gradient, leaving the chunk unchanged; NOT_FOUND for an unknown chunk; ABORTED for a second,
  // different push of one worker in one SYNC round.
  [[nodiscard]] absl::StatusOr<tessera::v1::PushResponse> Push(const tessera::v1::PushRequest& request);

  tessera::v1::ServerStats Stats() const;

 private:
  struct Chunk {
    explicit Chunk(int64_t length, int state_slots)
        : values(length), state(length * state_slots), sync_sum(0) {}

    mutable absl::Mutex mu;
    std::vector<float> values ABSL_GUARDED_BY(mu);
    std::vector<float> state ABSL_GUARDED_BY(mu);
    int64_t version ABSL_GUARDED_BY(mu) = 0;     // updates applied
    int64_t gradient_updates ABSL_GUARDED_BY(mu) = 0;  // optimizer steps taken (Adam's t)
    std::map<int, uint64_t> last_seq ABSL_GUARDED_BY(mu);
    std::vector<int64_t> applied_clocks ABSL_GUARDED_BY(mu);  // per worker id
    // SYNC round being collected (round == version).
    std::vector<float> sync_sum ABSL_GUARDED_BY(mu);
    double sync_weight ABSL_GUARDED_BY(mu) = 0;
    std::vector<int> sync_workers ABSL_GUARDED_BY(mu);
  };

  struct Counters {
    int64_t updates_applied = 0;
    int64_t pushes = 0;
    int64_t duplicate_pushes = 0;
    int64_t late_pushes = 0;
    StalenessHistogram staleness;
  };

  // What the job fixes for every chunk; set by the first Assign, constant afterwards.
  struct JobConfig {
    JobConfig(const tessera::v1::JobSpec& job) : job(job), rule(job.optimizer()) {}
    const tessera::v1::JobSpec job;
    const UpdateRule rule;
  };

  struct Found {
    Chunk* chunk;
    const JobConfig* config;
  };

  // The chunk for `key` after checking `epoch`, or the error to answer with.
  absl::StatusOr<Found> Find(uint64_t epoch, const tessera::v1::ChunkKey& key) const ABSL_LOCKS_EXCLUDED(mu_);

  // Applies `grad` (already validated) to `chunk`, advancing its version and the clocks of `workers` to
  // `clock` + 1.
  static void ApplyLocked(const JobConfig& config, Chunk& chunk, absl::Span<const float> grad, float lr_scale,
                          const std::vector<int>& workers, int64_t clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

  static int64_t ClockVersionLocked(const Chunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

  mutable absl::Mutex mu_;
  int server_id_ ABSL_GUARDED_BY(mu_) = -1;  // set by the first Assign
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<const JobConfig> config_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int>, std::unique_ptr<Chunk>> chunks_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex counters_mu_;
  Counters counters_ ABSL_GUARDED_BY(counters_mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SHARD_STORE_H_
