// The chunks one server owns, and the consistency rules that govern their updates. Transport-free: requests
// arrive as domain structs, values as a FloatPayload, and values leave as pooled buffers.
//
// Every request carries the shard-map epoch its sender holds. A request for an older epoch fails with
// FAILED_PRECONDITION carrying the store's epoch (see GetCurrentEpoch in common/status_macros.h); one for a newer
// epoch fails with UNAVAILABLE (the assignment is still on its way: retry).
//
// Consistency, set by the job:
//   SYNC   a chunk collects one gradient per worker for its current round (= its version); the last to arrive
//          applies the batch-size-weighted mean once. A push for a closed round is counted as late and ignored.
//          With backup workers (ConsistencySpec.backup_workers), the chunk keeps each worker's gradient apart
//          until the scheduler names the round's members (DecideRounds): the round closes with exactly those
//          workers' gradients, on every chunk alike; the others' are counted as late and dropped.
//   ASYNC  each gradient is applied on arrival.
//   SSP    applied like ASYNC; the scheduler's clock gate bounds how far workers drift apart.
// In every mode a push is applied at most once per (worker id, seq): a retried push answers `duplicate`.
//
// PushPull is a push whose answer is the chunk's values after it: in SYNC once the push's round has closed
// (so one exchange per chunk replaces push, clock barrier and pull on a sync step), otherwise at once.
//
// Staleness of a gradient = its clock minus the chunk's clock_version when the gradient's values were read
// (read_clock_version): how many clocks of some worker's updates it did not see. clock_version is the smallest
// count of clocks any worker of the job has had applied to the chunk.
#ifndef TESSERA_SERVER_SHARD_STORE_H_
#define TESSERA_SERVER_SHARD_STORE_H_

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/buffer_pool.h"
#include "common/float_payload.h"
#include "common/staleness_histogram.h"
#include "proto/checkpoint.pb.h"
#include "proto/cluster.pb.h"
#include "proto/ps.pb.h"
#include "common/update_rule.h"

namespace tessera {

// Which chunk, and under which shard-map epoch the sender addresses it.
struct ChunkAddress {
  uint64_t epoch = 0;
  std::string_view param;  // must outlive the call it is passed to
  int index = 0;
};

struct ChunkPull {
  ChunkAddress address;
  int64_t have_version = -1;  // the version the caller holds; its bytes are not sent again. -1: none
  int worker_id = 0;          // the caller's rank
};

struct ChunkPush {
  ChunkAddress address;
  int worker_id = 0;
  uint64_t incarnation = 0;         // the sender's; a replaced incarnation's pushes are refused
  uint64_t seq = 0;                 // per worker, strictly increasing; a repeated seq is applied once
  int64_t clock = 0;                // the step the gradient belongs to
  int64_t read_clock_version = 0;   // clock_version of the values the gradient was computed on
  int batch_size = 0;               // weight in the sync mean
  bool assign = false;              // overwrite the values instead of applying a gradient
  std::string member_key;           // the worker's, from its registration (checked against the view's digest)
};

struct PushOutcome {
  int64_t version = 0;
  bool duplicate = false;
  bool late = false;
};

// A chunk's values at one version. `bytes` holds `length` bytes of float32 values; null when the caller already
// held this version.
struct ChunkValues {
  int64_t version = 0;
  int64_t clock_version = 0;
  std::shared_ptr<const PooledBuffer> bytes;
  size_t length = 0;
};

// One PushPull waiting for its answer. Exactly one Complete() runs `done`; later ones do nothing, so the round
// closing and the caller giving up may race. Thread-safe.
class ExchangeWaiter {
 public:
  explicit ExchangeWaiter(std::function<void(absl::StatusOr<ChunkValues>)> done) : done_(std::move(done)) {}
  // Runs `done` with `result` unless it already ran; true when this call ran it.
  bool Complete(absl::StatusOr<ChunkValues> result);
  bool completed() const;

 private:
  mutable absl::Mutex mu_;
  std::function<void(absl::StatusOr<ChunkValues>)> done_ ABSL_GUARDED_BY(mu_);
};

// Thread-safe. Requests to different chunks run in parallel; requests to one chunk are serialised.
class ShardStore {
 public:
  // `max_cached_buffer_bytes` bounds the free reply and scratch buffers kept for reuse.
  explicit ShardStore(size_t max_cached_buffer_bytes = 64 << 20) : buffers_(max_cached_buffer_bytes) {}

  ShardStore(const ShardStore&) = delete;
  ShardStore& operator=(const ShardStore&) = delete;

  // Adopts the cluster view `map` (which must be newer than the current one) and the job: creates and
  // initialises the chunks placed on server `server_id` (this one) that it does not hold yet, and takes the
  // view's workers: a worker no longer active leaves the sync rounds (a round it was the last one missing from
  // closes now), a worker with a new incarnation starts a new sequence. Chunks the view places elsewhere
  // leave this server (their waiting exchanges are answered UNAVAILABLE: the caller follows the view). INVALID_ARGUMENT on a job or map it
  // cannot use; FAILED_PRECONDITION when a different job or id is already assigned or the map is older.
  //
  // With `restore` (the servers' checkpoint files of one checkpoint), chunks new to this server take their
  // values, optimizer state, versions and clocks from it instead of being initialised; with `restore_all`,
  // every chunk does (a rollback: open sync rounds are dropped and their exchanges answered UNAVAILABLE). A
  // sequence table is restored only for a worker rank whose incarnation is the one the checkpoint saw.
  // FAILED_PRECONDITION when a chunk to restore is not in the files.
  [[nodiscard]] absl::Status Assign(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job,
                                    int server_id, const std::vector<tessera::v1::ShardCheckpoint>* restore = nullptr,
                                    bool restore_all = false);

  // Every chunk's state for a checkpoint: at once (`at_version` < 0), or, in SYNC, each chunk as its version
  // reaches `at_version` (a consistent cut while the scheduler holds the workers there). DEADLINE_EXCEEDED
  // naming the chunks that did not get there; FAILED_PRECONDITION for a chunk already past it.
  // `cancelled`, when given, is asked every 100 ms while waiting (CANCELLED when it says so).
  [[nodiscard]] absl::StatusOr<tessera::v1::ShardCheckpoint> Snapshot(
      int64_t at_version, absl::Time deadline, const std::function<bool()>& cancelled = nullptr);

  // The chunk's value (no bytes when `have_version` is current). NOT_FOUND for a chunk not on this server;
  // INVALID_ARGUMENT for a worker id outside the job.
  [[nodiscard]] absl::StatusOr<ChunkValues> Pull(const ChunkPull& request) const;

  // Applies (or, in SYNC, collects) a gradient, or assigns values. INVALID_ARGUMENT for a wrong byte length,
  // non-finite values, or a bad worker id, batch size, seq, clock or read clock, leaving the chunk unchanged;
  // UNAUTHENTICATED when the view has the worker's key digest and the push does not carry that key; NOT_FOUND for an
  // unknown chunk; ABORTED for a second, different push of one worker in one SYNC round; FAILED_PRECONDITION
  // for a worker the view does not have in the job (lost, or an incarnation that was replaced); UNAVAILABLE for
  // a SYNC round that is not open yet (a worker that joined ahead of the others: retry).
  [[nodiscard]] absl::StatusOr<PushOutcome> Push(const ChunkPush& request, const FloatPayload& values);

  // Push, then completes `waiter` with the chunk's values after it: at once, except in SYNC while the push's
  // round is still open, when the waiter is completed by the push that closes it. Errors complete the waiter
  // with the status Push would return. Never blocks on other workers.
  void PushPull(const ChunkPush& request, const FloatPayload& values, std::shared_ptr<ExchangeWaiter> waiter);

  // SYNC with backup workers: the members of rounds the scheduler decided (recent ones, any order; rounds
  // already known or closed are ignored). Closes every round that has its members' gradients now.
  // INVALID_ARGUMENT, changing nothing, for more rounds than are kept or a worker id outside the job.
  [[nodiscard]] absl::Status DecideRounds(const tessera::v1::DecideRoundsRequest& request);

  // Completes every waiting PushPull with `why` (shutdown).
  void CancelWaiters(const absl::Status& why);

  tessera::v1::ServerStats Stats() const;
  uint64_t epoch() const;
  // The job's name; empty before the first Assign.
  std::string job_name() const;

 private:
  struct Chunk {
    Chunk(std::string param, int index, int64_t length, int state_slots)
        : key(std::move(param), index), values(length), state(length * state_slots) {}

    const std::pair<std::string, int> key;  // parameter, chunk index
    mutable absl::Mutex mu;
    std::vector<float> values ABSL_GUARDED_BY(mu);
    std::vector<float> state ABSL_GUARDED_BY(mu);
    int64_t version ABSL_GUARDED_BY(mu) = 0;     // updates applied
    int64_t gradient_updates ABSL_GUARDED_BY(mu) = 0;  // optimizer steps taken (Adam's t)
    // The largest |value| and |state| after the last update (infinity: not known yet, e.g. after a restore).
    float values_bound ABSL_GUARDED_BY(mu) = std::numeric_limits<float>::infinity();
    float state_bound ABSL_GUARDED_BY(mu) = std::numeric_limits<float>::infinity();
    std::map<int, uint64_t> last_seq ABSL_GUARDED_BY(mu);
    std::vector<int64_t> applied_clocks ABSL_GUARDED_BY(mu);  // per worker id
    // SYNC round being collected (round == version); sync_sum is allocated in SYNC jobs only.
    std::vector<float> sync_sum ABSL_GUARDED_BY(mu);
    double sync_weight ABSL_GUARDED_BY(mu) = 0;
    std::vector<int> sync_workers ABSL_GUARDED_BY(mu);
    // SYNC with backup workers: each worker's gradient of the open round and its batch size (0: none yet).
    std::vector<std::vector<float>> pending ABSL_GUARDED_BY(mu);
    std::vector<int> pending_batch ABSL_GUARDED_BY(mu);
    // PushPulls of the open SYNC round, answered when it closes.
    std::vector<std::shared_ptr<ExchangeWaiter>> waiters ABSL_GUARDED_BY(mu);
  };

  struct Counters {
    int64_t updates_applied = 0;
    int64_t pushes = 0;
    int64_t duplicate_pushes = 0;
    int64_t late_pushes = 0;
    StalenessHistogram staleness;
    std::vector<StalenessHistogram> worker_staleness;  // by worker id
  };

  // What the job fixes for every chunk; set by the first Assign, constant afterwards.
  struct JobConfig {
    JobConfig(const tessera::v1::JobSpec& job) : job(job), rule(AppliedOptimizer(job)) {}
    const tessera::v1::JobSpec job;
    const UpdateRule rule;
  };

  // The view's workers, as of the last Assign. Immutable once published.
  struct Roster {
    std::vector<bool> active;
    std::vector<uint64_t> incarnation;
    std::vector<int64_t> joined_clock;
    std::vector<std::string> key_digest;  // SHA-256 of each worker's member key; empty: not checked
    // Does sync round `round` wait for `worker`?
    bool InRound(int worker, int64_t round) const { return active[worker] && joined_clock[worker] <= round; }
  };

  struct Found {
    Chunk* chunk;
    const JobConfig* config;
    std::shared_ptr<const Roster> roster;
  };

  // What one push did under the chunk's lock.
  struct Applied {
    PushOutcome outcome;
    bool round_open = false;  // SYNC: the push's round still waits for other workers
    std::vector<std::shared_ptr<ExchangeWaiter>> closed_waiters;  // SYNC: PushPulls of the round it closed
    int64_t dropped = 0;      // SYNC with backup workers: late gradients the closed round left out
    bool after_close = false; // SYNC: the push's round had closed before it came
    ChunkValues values;       // after the push (when asked for)
  };

  // Rounds closed outside a push: the exchanges that waited for each, and the values to answer them with.
  using ClosedRounds = std::vector<std::pair<std::vector<std::shared_ptr<ExchangeWaiter>>, ChunkValues>>;

  absl::Status AdoptView(
      const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job, int server_id,
      const std::vector<tessera::v1::ShardCheckpoint>* restore, bool restore_all,
      ClosedRounds& closed,
      std::vector<std::shared_ptr<ExchangeWaiter>>& dropped) ABSL_LOCKS_EXCLUDED(mu_);

  // The chunk's state as a checkpoint holds it.
  static tessera::v1::ChunkState ChunkStateLocked(const std::string& param, int index, const Chunk& chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // Takes the chunk's state from a checkpoint (the sizes must match; checked by the caller).
  static void RestoreChunkLocked(const tessera::v1::ChunkState& state, const std::vector<bool>& keep_seq, Chunk& chunk,
                                 std::vector<std::shared_ptr<ExchangeWaiter>>& dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // A SYNC checkpoint waiting for chunks to reach its version: ApplyLocked hands them over.
  void OfferToSnapshotLocked(const Chunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

  // The chunk for `address` after checking its epoch, or the error to answer with.
  absl::StatusOr<Found> Find(const ChunkAddress& address) const ABSL_LOCKS_EXCLUDED(mu_);

  // Validates and applies one push. With `waiter` (PushPull), a SYNC push whose round stays open parks the
  // waiter on the chunk, and `values` of the result are filled otherwise.
  absl::StatusOr<Applied> PushInternal(const ChunkPush& request, const FloatPayload& payload,
                                       const std::shared_ptr<ExchangeWaiter>* waiter);

  // A copy of the chunk's values into a pooled buffer.
  ChunkValues SnapshotLocked(const Chunk& chunk, const Roster& roster) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

  // Applies `grad` (already validated) to `chunk`, advancing its version and the clocks of `workers` to
  // `clock` + 1. An update that would leave a value or optimizer state non-finite (finite gradients can still
  // overflow: a huge one, or a diverging job) is undone: false, and the chunk is as it was.
  [[nodiscard]] static bool ApplyLocked(const JobConfig& config, Chunk& chunk, absl::Span<const float> grad, float lr_scale,
                          float grad_scale, const std::vector<int>& workers, int64_t clock)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

  // The smallest clock of the active workers' updates in the chunk.
  static int64_t ClockVersionLocked(const Chunk& chunk, const Roster& roster) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // SYNC: every worker round `chunk.version` waits for has pushed it (with backup workers: the round's members
  // are decided and every one still in the job has pushed it).
  bool RoundCompleteLocked(const Chunk& chunk, const Roster& roster) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // SYNC: applies the collected round and hands back the exchanges that waited for it. With backup workers
  // the round's members' gradients are summed first; `dropped` counts the others'.
  std::vector<std::shared_ptr<ExchangeWaiter>> CloseRoundLocked(const JobConfig& config, Chunk& chunk,
                                                                int64_t* dropped = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // SYNC: when the chunk has gradients of its open round and the round is complete (after a new view or a
  // round decision), closes it into `closed`, counting the late gradients it left out in `dropped`.
  void CloseIfCompleteLocked(const JobConfig& config, Chunk& chunk, const Roster& roster, int64_t& dropped,
                             ClosedRounds& closed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // SYNC with backup workers: the members of `round` (ascending), or null while undecided.
  std::shared_ptr<const std::vector<int>> MembersOf(int64_t round) const ABSL_LOCKS_EXCLUDED(decided_mu_);

  mutable BufferPool buffers_;  // reply and scratch buffers

  mutable absl::Mutex mu_;
  int server_id_ ABSL_GUARDED_BY(mu_) = -1;  // set by the first Assign
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<const JobConfig> config_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Roster> roster_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Chunk>> retired_ ABSL_GUARDED_BY(mu_);  // moved to other servers
  std::map<std::pair<std::string, int>, std::unique_ptr<Chunk>> chunks_ ABSL_GUARDED_BY(mu_);

  // The snapshot in progress (Snapshot with a version): chunks taken so far.
  std::atomic<int64_t> snapshot_at_{-1};
  absl::Mutex snapshot_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<std::pair<std::string, int>, tessera::v1::ChunkState> snapshot_ ABSL_GUARDED_BY(snapshot_mu_);

  // SYNC with backup workers: decided rounds' members (the newest kDecidedRoundsKept).
  static constexpr size_t kDecidedRoundsKept = 1024;
  mutable absl::Mutex decided_mu_;
  std::map<int64_t, std::shared_ptr<const std::vector<int>>> decided_ ABSL_GUARDED_BY(decided_mu_);

  mutable absl::Mutex counters_mu_;
  Counters counters_ ABSL_GUARDED_BY(counters_mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SHARD_STORE_H_
