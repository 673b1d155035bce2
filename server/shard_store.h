// What one server holds, and the rules every request to it follows, whatever kind of parameter it is for.
// Transport-free: requests arrive as domain structs (from ServerService over gRPC, FabricService over UCX),
// values as a FloatPayload, and values leave as pooled buffers.
//
// The store serves the dense path (chunks: pull, push, exchange) and owns what the kinds share: the views
// adopted (server/store_state.h), the job's consistency policy, the exchanges waiting on rounds, snapshots and
// the counters (server/store_counters.h). The parameters themselves are tables of units (server/tables/table.h;
// the dense kind: DenseTable of Chunks); embedding tables' rows have a path of their own (server/row_requests.h),
// and every request takes the checks of server/request_checks.h first. Adopting a new view is ViewAdoption's
// (server/view_adoption.h); replication is ReplicaShipper's on a primary and ReplicaTaker's on a backup
// (server/replication/).
//
// Every request carries the shard-map epoch its sender holds. A request for an older epoch fails with
// FAILED_PRECONDITION carrying the store's epoch (see GetCurrentEpoch in common/base/status_macros.h); one for a newer
// epoch fails with UNAVAILABLE (the assignment is still on its way: retry).
//
// Consistency is the job's: the store holds the policy object of its mode (server/consistency/policy.h), which
// admits gradients and collects and closes SYNC rounds; everything else here is the same in every mode.
// In every mode a push is applied at most once per (worker id, seq): a retried push answers `duplicate`.
//
// PushPull is a push whose answer is the chunk's values after it: in SYNC once the push's round has closed
// (so one exchange per chunk replaces push, clock barrier and pull on a sync step), otherwise at once.
//
// Replication (ReplicationSpec.backups > 0): the view names each unit's primary and backups. This store serves
// the units it is primary of and keeps a copy of those it backs up. After an update, a primary hands the unit's
// state to its backups (coalescing the updates that arrive meanwhile into one hand-over) and answers the update's
// caller only once every backup holds it; a SYNC round's exchanges are answered once the round's update is on
// the backups. When the view makes a backup the primary, it serves from the state it holds.
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
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/buffer_pool.h"
#include "common/model/float_payload.h"
#include "common/model/staleness_histogram.h"
#include "common/base/thread_pool.h"
#include "common/model/update_rule.h"
#include "proto/checkpoint.pb.h"
#include "proto/cluster.pb.h"
#include "proto/ps.pb.h"
#include "server/checkpoint_cut.h"
#include "server/chunk_requests.h"
#include "server/consistency/policy.h"
#include "server/tables/exchange_waiter.h"
#include "server/job_config.h"
#include "server/replication/replica_sender.h"
#include "server/replication/replica_shipper.h"
#include "server/replication/replica_taker.h"
#include "server/row_requests.h"
#include "server/store_counters.h"
#include "server/store_state.h"
#include "server/tables/chunk.h"
#include "server/view_adoption.h"

namespace tessera {

// Thread-safe. Requests to different chunks run in parallel; requests to one chunk are serialised.
class ShardStore {
 public:
  // `max_cached_buffer_bytes` bounds the free reply and scratch buffers kept for reuse. `replicas` (not owned;
  // must outlive the store) carries chunk states to backups; a job with backups needs one. `row_memory_cap` bounds
  // the memory of embedding tables' rows (0: no cap).
  // `replication_key` is this server's (server/replica_auth.h): a store without one takes no hand-over.
  explicit ShardStore(size_t max_cached_buffer_bytes = 64 << 20, ReplicaSender* replicas = nullptr,
                      int64_t row_memory_cap = 0, std::shared_ptr<const ReplicaKey> replication_key = nullptr)
      : buffers_(max_cached_buffer_bytes),
        state_(row_memory_cap),
        taker_(state_, std::move(replication_key)),
        shipper_(state_, replicas) {}
  // Waits for hand-overs to backups still on their way.
  ~ShardStore() = default;

  // Called (on the store's retry thread, at most once a second per server) with a backup that did not answer a
  // hand-over, so that its loss is noticed before the heartbeat timeout. Set before the first Assign.
  void set_on_unreachable(std::function<void(int server_id, uint64_t incarnation, const absl::Status&)> report) {
    shipper_.set_on_unreachable(std::move(report));
  }

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

  // Every chunk's state for a checkpoint: at once (`at_version` < 0), or, in SYNC, each chunk as its round
  // (RoundLocked) reaches `at_version` (a consistent cut while the scheduler holds the workers there). DEADLINE_EXCEEDED
  // naming the chunks that did not get there; FAILED_PRECONDITION for a chunk already past it.
  // `cancelled`, when given, is asked every 100 ms while waiting (CANCELLED when it says so).
  // With `delta_base_path` (CheckpointRequest.delta_base_path): embedding slots as deltas over the full checkpoint
  // this server noted at that path (NoteFullCheckpoint), each slot it did not hold then whole.
  [[nodiscard]] absl::StatusOr<tessera::v1::ShardCheckpoint> Snapshot(
      int64_t at_version, absl::Time deadline, const std::function<bool()>& cancelled = nullptr,
      const std::string& delta_base_path = "");
  // `written` (a Snapshot without a delta base) is on disk at `path`: later deltas may apply over it.
  void NoteFullCheckpoint(const std::string& path, const tessera::v1::ShardCheckpoint& written)
      ABSL_LOCKS_EXCLUDED(full_mu_);

  // The chunk's value (no bytes when `have_version` is current). NOT_FOUND for a chunk not on this server;
  // INVALID_ARGUMENT for a worker id outside the job.
  [[nodiscard]] absl::StatusOr<ChunkValues> Pull(const ChunkPull& request) const;

  // Applies (or, in SYNC, collects) a gradient, or assigns values. INVALID_ARGUMENT for a wrong byte length,
  // non-finite values, or a bad worker id, batch size, seq (1 .. kMaxUpdateCount), clock or read clock (0 ..
  // kMaxClock), leaving the chunk unchanged;
  // UNAUTHENTICATED when the view has the worker's key digest and the push does not carry that key; NOT_FOUND for an
  // unknown chunk; ABORTED for a second, different push of one worker in one SYNC round; FAILED_PRECONDITION
  // for a worker the view does not have in the job (lost, or an incarnation that was replaced); UNAVAILABLE for
  // a SYNC round that is not open yet (a worker that joined ahead of the others: retry).
  // `done` runs once the update is on every backup of the chunk (at once without backups), on any thread; an
  // error there (the chunk moved away meanwhile: UNAVAILABLE) means the caller retries it where the view says.
  using PushDone = std::function<void(absl::StatusOr<PushOutcome>)>;
  void Push(const ChunkPush& request, const FloatPayload& values, PushDone done);
  // Push, waiting for its answer.
  [[nodiscard]] absl::StatusOr<PushOutcome> Push(const ChunkPush& request, const FloatPayload& values);

  // Replication, on a backup: takes the state of a chunk this server backs up from the server the view names as
  // its primary. `credential` must be that server's credential of the request for this server (its id and
  // incarnation), checked with this server's replication key and the one its view holds for the primary
  // (server/replica_auth.h); UNAUTHENTICATED otherwise, a view without that key included. A state older than the one held is ignored.
  // Returns the version held (the primary counts a hand-over as held only when it is the version it sent).
  // The epoch is never taken from the request: ABORTED when the request's view is newer than this server's (it
  // is on its way: retry), changing nothing; FAILED_PRECONDITION when this server's view has no such backup or
  // another primary, or updates that do not follow the version held (the primary then sends the whole state);
  // INVALID_ARGUMENT for a number beyond common/model/wire_limits.h (CheckReplicateRequest), a state of another size
  // or with non-finite values.
  [[nodiscard]] absl::StatusOr<int64_t> TakeReplica(const tessera::v1::ReplicateRequest& request,
                                                    std::string_view credential);
  // The same for a call of many units from one primary, with one credential (ReplicateBatch): a number out of
  // bounds in any unit, two primaries, an epoch newer than this server's view or a credential that does not hold
  // refuse the
  // whole call and change nothing; otherwise one result per unit, in order, as TakeReplica's.
  [[nodiscard]] absl::StatusOr<std::vector<absl::StatusOr<int64_t>>> TakeReplicas(
      const tessera::v1::ReplicateBatch& batch, std::string_view credential);

  // Whether `key` is worker `worker`'s member key in this server's view, as every push of that worker is
  // checked (a connection's check, for transports that authenticate once per connection). UNAUTHENTICATED
  // when it is not; INVALID_ARGUMENT for a worker id out of range; UNAVAILABLE before the first view.
  [[nodiscard]] absl::Status CheckMemberKey(int worker, std::string_view key) const;
  // The job this server serves (transport, trusted network); empty before the first view.
  tessera::v1::JobSpec job() const;

  // Push, then completes `waiter` with the chunk's values after it: at once, except in SYNC while the push's
  // round is still open, when the waiter is completed by the push that closes it. Errors complete the waiter
  // with the status Push would return. Never blocks on other workers.
  void PushPull(const ChunkPush& request, const FloatPayload& values, std::shared_ptr<ExchangeWaiter> waiter);

  // SYNC with backup workers: the members of rounds the scheduler decided (recent ones, any order; rounds
  // already known or closed are ignored). Closes every round that has its members' gradients now.
  // INVALID_ARGUMENT, changing nothing, for more rounds than are kept or a worker id outside the job.
  [[nodiscard]] absl::Status DecideRounds(const tessera::v1::DecideRoundsRequest& request);

  // Embedding tables' rows (server/row_requests.h: RowRequests::Pull and Push).
  using RowPullDone = RowRequests::PullDone;
  using RowPushDone = RowRequests::PushDone;
  void PullRows(std::shared_ptr<const tessera::v1::RowPullRequest> request, RowPullDone done) const {
    rows_.Pull(std::move(request), std::move(done));
  }
  [[nodiscard]] absl::StatusOr<tessera::v1::RowPullResponse> PullRows(const tessera::v1::RowPullRequest& request) const {
    return rows_.Pull(request);
  }
  void PushRows(const tessera::v1::RowPushRequest& request, std::string_view member_key, RowPushDone done) {
    rows_.Push(request, member_key, std::move(done));
  }

  // Completes every waiting PushPull and push with `why` (shutdown).
  void CancelWaiters(const absl::Status& why);

  tessera::v1::ServerStats Stats() const;
  uint64_t epoch() const;
  // The cluster view this server holds (empty before the first Assign): what it brings back to a restarted
  // scheduler.
  tessera::v1::ShardMap view() const;
  // The job's name; empty before the first Assign.
  std::string job_name() const;

 private:
  struct Found {
    Chunk* chunk;
    const JobConfig* config;
    std::shared_ptr<const Roster> roster;
  };

  // What one push did under the chunk's lock.
  struct Applied {
    Chunk* chunk = nullptr;
    PushOutcome outcome;
    Admission admission;
    ChunkValues values;  // after the push (when asked for)
  };

  // A round closed outside a push: the exchanges that waited for it, and the values to answer them with once
  // the chunk's backups hold `values.version`.
  struct ClosedRound {
    Chunk* chunk;
    std::vector<std::shared_ptr<ExchangeWaiter>> waiters;
    ChunkValues values;
  };
  using ClosedRounds = std::vector<ClosedRound>;

  // Adopts the view under the lock; the rounds it closes go to `closed` and `rows`. `restore_all`: a rollback.
  absl::Status AdoptView(ViewAdoption& adoption, int server_id, bool restore_all, ClosedRounds& closed,
                         RowsTaken& rows) ABSL_LOCKS_EXCLUDED(state_.mu);
  // Answers closed rounds' exchanges, each once its chunk's backups hold the round.
  void AnswerClosedRounds(ClosedRounds& closed);

  // The chunk for `address` after checking its epoch, or the error to answer with.
  absl::StatusOr<Found> Find(const ChunkAddress& address) const ABSL_LOCKS_EXCLUDED(state_.mu);

  // Validates and applies one push. With `waiter` (PushPull), a SYNC push whose round stays open parks the
  // waiter on the chunk, and `values` of the result are filled otherwise.
  absl::StatusOr<Applied> PushInternal(const ChunkPush& request, const FloatPayload& payload,
                                       const std::shared_ptr<ExchangeWaiter>* waiter);
  // The checks of a push that need no chunk lock: its worker, member key, sequence number and numbers.
  absl::Status CheckPush(const ChunkPush& request, const FloatPayload& payload, const Found& found,
                         const std::string& what) const;
  // The push's values, checked finite: read where they were received (pieces, with what is not aligned for
  // floats in `scratch`), or decoded where the payload lies or into `scratch`.
  absl::StatusOr<FloatPieces> DecodePush(Chunk& chunk, const FloatPayload& payload,
                                         std::shared_ptr<PooledBuffer>& scratch, const std::string& what) const;
  // Applies a validated push to `chunk` (found.chunk) under its lock (exactly once per worker and sequence number).
  absl::Status ApplyLocked(const ChunkPush& request, const FloatPieces& values, Chunk& chunk, const Found& found,
                           const std::shared_ptr<ExchangeWaiter>* waiter, const std::string& what, Applied& applied)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // Counts a push that was taken.
  void CountPush(const ChunkPush& request, const FloatPayload& payload, const Applied& applied);

  // The answer to a norm-only push: the squared norm of its closed norm round, no values.
  ChunkValues NormLocked(const Chunk& chunk, const Roster& roster, double sq_norm) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // The chunk's values in `precision`, in a pooled buffer.
  ChunkValues ValuesLocked(const Chunk& chunk, const Roster& roster, WirePrecision precision) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);

  // After a new view or a round decision: closes every chunk's round that is complete now, into `closed`, and
  // counts the late gradients the rounds left out; applies the rounds of rows complete now, into `rows`.
  void CloseCompleteRounds(const JobConfig& config, const Roster& roster, ClosedRounds& closed, RowsTaken& rows)
      ABSL_SHARED_LOCKS_REQUIRED(state_.mu);

  mutable BufferPool buffers_;  // reply and scratch buffers
  StoreState state_;            // the views adopted and the tables
  CheckpointCut cut_;           // a SYNC checkpoint waiting for chunks to reach its version

  // The last full checkpoint this server wrote: its path and each embedding slot's version in it. Forgotten when
  // the server restores a checkpoint (its slots' versions go back).
  absl::Mutex full_mu_;
  std::string last_full_path_ ABSL_GUARDED_BY(full_mu_);
  std::map<UnitKey, int64_t> last_full_versions_ ABSL_GUARDED_BY(full_mu_);

  StoreCounters counters_;
  RowRequests rows_{state_, buffers_, counters_, shipper_};  // the rows' path

  ReplicaTaker taker_;
  // Last member: hand-overs still on their way end before the rest goes.
  ReplicaShipper shipper_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SHARD_STORE_H_
