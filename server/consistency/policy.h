// How a server's chunks take gradients under the job's consistency mode: one policy object per job, chosen once
// (ConsistencyPolicy::ForJob), so the store never branches on the mode.
//
//   ASYNC, SSP           AsyncPolicy: each gradient is applied on arrival (SSP's bound is the scheduler's clock
//                        gate; the servers need not know it). With staleness_aware_lr the step is divided by
//                        the gradient's staleness; with delay_compensation the gradient is corrected toward the
//                        values it lands on (DC-ASGD), from the values its worker last read (NoteReadLocked).
//   SYNC                 SyncPolicy: a chunk collects one gradient per worker of its current round (= its
//                        version); the last to arrive applies the batch-size-weighted mean once. A push for a
//                        closed round is counted as late and ignored.
//   SYNC, backup workers BackupSyncPolicy: each worker's gradient is kept apart until the scheduler names the
//                        round's members (Decide); the round closes with exactly those workers' gradients, on
//                        every chunk alike; the others' are counted as late and dropped.
//
// Rows of embedding tables follow the same modes (server/consistency/row_rounds.h): applied on arrival in ASYNC
// and SSP; in SYNC summed over a round's members and applied once when it closes.
//
// Every method taking a chunk runs under its lock. The store does what is common to every mode: checking the
// request, the exactly-once sequence, assignments, answering exchanges and offering closed rounds to a
// checkpoint; for rows, applying the updates the policy hands it (memory, eviction, the table's optimizer).
#ifndef TESSERA_SERVER_CONSISTENCY_POLICY_H_
#define TESSERA_SERVER_CONSISTENCY_POLICY_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/update_rule.h"
#include "proto/job.pb.h"
#include "server/tables/chunk.h"
#include "server/chunk_requests.h"
#include "server/consistency/row_rounds.h"

namespace tessera {

// What admitting one push did.
struct Admission {
  bool late = false;         // the gradient is in no update (its round closed, or it was left out of it)
  bool after_close = false;  // ... because its round had closed before it came
  bool round_open = false;   // its round still waits for other workers: an exchange of it waits too
  bool closed = false;       // it closed its chunk's round: `closed_waiters` are to be answered
  std::vector<std::shared_ptr<ExchangeWaiter>> closed_waiters;
  int64_t dropped = 0;       // late gradients the closed round left out
  int64_t staleness = -1;    // of the gradient, when it counts (-1: not counted)
  double round_sq_norm = 0;  // a norm-only push whose norm round is closed: the squared norm of its mean
  // Delay compensation: the push was corrected, with these squared norms of its gradient and of the correction.
  bool compensated = false;
  double grad_sq = 0;
  double compensation_sq = 0;
};

// Backup workers: how many decided rounds a server keeps (the newest).
inline constexpr size_t kDecidedRoundsKept = 1024;

class ConsistencyPolicy {
 public:
  // The policy of `consistency`, applying updates with `rule` (which must outlive it).
  static std::unique_ptr<ConsistencyPolicy> ForJob(const tessera::v1::ConsistencySpec& consistency,
                                                   const UpdateRule& rule);
  virtual ~ConsistencyPolicy() = default;

  // Gives a new chunk of a job with `workers` workers what this mode keeps per chunk.
  virtual void PrepareChunkLocked(Chunk& chunk, int workers) const {}

  // The chunk's values as they are now were answered to `worker` (a pull, or an exchange's answer).
  virtual void NoteReadLocked(Chunk& chunk, int worker) const {}

  // Takes one checked gradient `grad` of `push` (not a duplicate, not an assignment). An error leaves the chunk
  // unchanged: UNAVAILABLE for a round not open yet, ABORTED for a second, different push of one worker in one
  // round, INVALID_ARGUMENT for an update that would make values non-finite. `what` names the push in errors.
  virtual absl::StatusOr<Admission> AdmitLocked(const ChunkPush& push, const FloatPieces& grad, Chunk& chunk,
                                                const Roster& roster, const std::string& what) = 0;

  // SYNC clipping (PushRequest.norm_only): takes one checked gradient `grad` into the chunk's norm round of
  // push.clock, changing nothing else. `closed` when the norm round is closed (by this push, or before: a retry),
  // with its squared norm and the exchanges that waited for it; `round_open` while it waits for other workers.
  // UNAVAILABLE for a round not open yet, ABORTED for a round whose update was applied already,
  // FAILED_PRECONDITION where the mode has no norm rounds.
  virtual absl::StatusOr<Admission> AdmitNormLocked(const ChunkPush& push, const FloatPieces& grad, Chunk& chunk,
                                                    const Roster& roster, const std::string& what) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": a norm-only push is for SYNC jobs that clip"));
  }
  // After a new view: closes the chunk's norm round when it has gradients and is complete now, appending its
  // waiting exchanges to `closed` and setting `sq_norm`. True when it closed one.
  virtual bool CloseNormIfCompleteLocked(Chunk& chunk, const Roster& roster, double& sq_norm,
                                         std::vector<std::shared_ptr<ExchangeWaiter>>& closed) {
    return false;
  }

  // A retried push that was applied already: does its exchange wait for the round, like the original did?
  virtual bool DuplicateWaitsLocked(const ChunkPush& push, const Chunk& chunk) const { return false; }

  // After a new view or a round decision: closes the chunk's round when it has gradients and is complete now,
  // appending its waiting exchanges to `closed` and counting the gradients it left out in `dropped`. True when
  // it closed one.
  virtual bool CloseIfCompleteLocked(Chunk& chunk, const Roster& roster, int64_t& dropped,
                                     std::vector<std::shared_ptr<ExchangeWaiter>>& closed) {
    return false;
  }

  // Backup workers: the members of rounds the scheduler decided (each sorted ascending; the newest word on a
  // round wins). Other modes ignore decisions.
  virtual void Decide(std::vector<std::pair<int64_t, std::vector<int>>> rounds) {}
  virtual bool decides_rounds() const { return false; }

  // Rows (row_rounds.h). Takes one checked push of rows: the updates it makes go to `apply` (under the policy's
  // lock), what is left to answer to `taken`. Errors are answers in `taken`: UNAVAILABLE for a SYNC round not open
  // yet, ABORTED for a second, different push of one worker in one round.
  virtual void AdmitRows(RowPush push, RowAnswer done, const Roster& roster, const RowApplier& apply,
                         RowsTaken& taken) = 0;
  // After a new view or a round decision: applies the rounds of rows that are complete now.
  virtual void CloseRowRounds(const Roster& roster, const RowApplier& apply, RowsTaken& taken) {}
  // A pull of `table` at `clock`: true when it waits for a round of rows (`retry` runs once it is applied).
  virtual absl::StatusOr<bool> ParkRowPull(const std::string& table, int64_t clock, std::function<void()> retry) {
    return false;
  }
  // Drops the open rounds of rows that hold a slot for which `gone` is true (RowRounds::Drop).
  virtual void DropRowRounds(const std::function<bool(RowSlot&)>& gone, const absl::Status& why, bool forget,
                             RowsTaken& taken) {}
  // Answers every push and pull of rows that waits with `why` (shutdown).
  virtual void CancelRowRounds(const absl::Status& why, RowsTaken& taken) {}
};

}  // namespace tessera

#endif  // TESSERA_SERVER_CONSISTENCY_POLICY_H_
