// How the rows of embedding tables take gradients under the job's consistency mode: the rows' half of
// server/consistency/policy.h, with the types a push of rows travels in between the store and its policy.
//
//   ASYNC, SSP   each push of rows is applied on arrival (AsyncPolicy).
//   SYNC         RowRounds: each table collects one round at a time on each server, the round of the pushing
//                workers' clock. Every worker of a round pushes to every server that is primary of one of the
//                table's slots, an empty push where its batch touched none of them (PsClient::PushRows), so that
//                a server knows when its round is complete. Each worker's rows are kept apart until the round
//                closes; then every row the round touched takes sum_w b_w g_w / sum_w b_w over the round's
//                members (b_w: a member's batch size; g_w: its gradient of the row, zero where it did not touch
//                it), summed in ascending worker order, and the row's optimizer steps once: what one process
//                does on the union batch, for every row optimizer.
//                Without backup workers a round closes when its last member's push arrives, and each of its
//                pushes is answered once the update is on the slots' backups (so an answered push is never lost
//                to a failover, and a worker's next pull always sees the round).
//                With backup workers the scheduler names a round's members (Decide) once they advanced their
//                clocks, which they do after their row pushes were answered: a push is answered once it is
//                collected, the round closes at the decision, and a pull at clock c waits until the table's
//                rounds before c are applied on this server. A push for a round that closed, or that closed
//                without its worker, is late: counted, never applied.
#ifndef TESSERA_SERVER_CONSISTENCY_ROW_ROUNDS_H_
#define TESSERA_SERVER_CONSISTENCY_ROW_ROUNDS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/row_batch.h"
#include "proto/ps.pb.h"
#include "server/tables/chunk.h"
#include "server/tables/sparse_table.h"

namespace tessera {

// One slot's part of a push or of an update: its rows, each id once.
struct SlotRows {
  RowSlot* slot = nullptr;  // not owned; units outlive the store's requests
  RowGradients rows;
};

// One checked push of rows (ShardStore::PushRows).
struct RowPush {
  const RowTableSpec* spec = nullptr;  // not owned
  int worker = 0;
  uint64_t seq = 0;
  int64_t clock = 0;
  int batch_size = 0;
  float lr_factor = 1.0f;
  bool skip = false;  // the worker skips its step (its gradient scaler found inf or NaN)
  std::vector<SlotRows> slots;
};

using RowAnswer = std::function<void(absl::StatusOr<tessera::v1::RowPushResponse>)>;

// A push waiting for the update it is in: its answer reports the rows of its own ids the update reached.
struct RowWaiter {
  RowAnswer done;
  std::vector<std::pair<RowSlot*, std::vector<uint64_t>>> ids;  // by slot, ascending
};

// One update of rows for the store to apply: each slot's rows with the table's optimizer at `clock`.
struct RowUpdate {
  const RowTableSpec* spec = nullptr;
  std::vector<SlotRows> slots;  // each slot once
  float lr_factor = 1.0f;
  int64_t clock = 0;
  bool skip = false;                             // a member skipped its step: nothing changes
  std::vector<std::pair<int, uint64_t>> pushes;  // (worker, seq) of the pushes in it, marked on its slots
  std::vector<RowWaiter> waiters;                // answered once the update is on the backups
};

// What the store did with an update (ShardStore's applier).
struct RowUpdateResult {
  absl::Status status;                                // RESOURCE_EXHAUSTED or moved away: not (all) applied
  std::vector<std::pair<RowSlot*, int64_t>> held;     // slots applied, with their version after it
  std::map<const RowSlot*, std::vector<uint64_t>> refused;  // ids not updated (admission, overflow), ascending
  int64_t updated = 0;
  int64_t refused_rows = 0;
  bool duplicate = false;  // every slot had applied it before
};
// Applies an update; the policy calls it under its own lock, so that the rounds of a table apply in order.
using RowApplier = std::function<RowUpdateResult(const RowUpdate&)>;

// What admitting a push or closing rounds left for the store to do once no lock is held.
struct RowsTaken {
  std::vector<std::pair<RowUpdate, RowUpdateResult>> applied;  // answer the waiters once the backups hold them
  std::vector<std::pair<RowAnswer, absl::StatusOr<tessera::v1::RowPushResponse>>> now;  // answer at once
  std::vector<std::function<void()>> pulls;  // pulls that waited for a round applied now: run them again
  int64_t late = 0;                          // pushes counted as late
};

// The members of a decided round (ascending), or null while undecided.
using RoundMembersOf = std::function<std::shared_ptr<const std::vector<int>>(int64_t round)>;

// SYNC for the rows of every table on one server (see the file comment). Thread-safe.
class RowRounds {
 public:
  // `decided`: the job has backup workers; `members_of` then names a round's members.
  RowRounds(bool decided, RoundMembersOf members_of) : decided_(decided), members_of_(std::move(members_of)) {}

  // Takes `push`, answering `done` (now, or when its round closes: see the file comment). A round it completes is
  // applied through `apply`. UNAVAILABLE for a round not open yet; ABORTED for a second, different push of one
  // worker in one round.
  void Admit(RowPush push, RowAnswer done, const Roster& roster, const RowApplier& apply, RowsTaken& taken)
      ABSL_LOCKS_EXCLUDED(mu_);
  // After a new view or a decision: applies every round that is complete now.
  void CloseComplete(const Roster& roster, const RowApplier& apply, RowsTaken& taken) ABSL_LOCKS_EXCLUDED(mu_);
  // A pull of `table` at `clock`: true when it must wait for a round before `clock` (`retry` then runs once that
  // round is applied, or dropped); false to read now. UNAVAILABLE when too many pulls wait already.
  absl::StatusOr<bool> ParkPull(const std::string& table, int64_t clock, std::function<void()> retry)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops every open round that holds rows of a slot for which `gone` is true (the view moved it, or a rollback
  // restored it; `gone` runs under the slot's lock), answering its waiting pushes with `why` (their workers push
  // them again, and they are collected again). `forget`: a rollback, the rounds' history goes too.
  void Drop(const std::function<bool(RowSlot&)>& gone, const absl::Status& why, bool forget, RowsTaken& taken)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Answers every waiting push with `why` and runs every waiting pull again, which then, as every later pull that
  // would wait, fails with `why` (shutdown).
  void Cancel(const absl::Status& why, RowsTaken& taken) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Contribution {
    uint64_t seq = 0;
    int batch_size = 0;
    float lr_factor = 1.0f;
    bool skip = false;
    std::vector<SlotRows> slots;
  };
  // One table's rounds on this server.
  struct Round {
    const RowTableSpec* spec = nullptr;
    int64_t open = -1;    // the round being collected; -1: none
    int64_t closed = -1;  // the newest round applied
    std::map<int, Contribution> collected;  // by worker, ascending
    std::map<int, uint64_t> last_seq;       // per worker: the newest push taken
    std::vector<RowWaiter> waiters;         // without decisions: answered when the round is applied
    std::vector<std::function<void()>> pulls;
  };

  bool CompleteLocked(const Round& round, const Roster& roster) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sums the round's members' rows into one update, applies it and starts the next round.
  void CloseLocked(Round& round, const RowApplier& apply, RowsTaken& taken) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the open round (its rows and waiters); its workers' pushes are taken again when retried.
  void ResetLocked(Round& round, const absl::Status& why, RowsTaken& taken) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const bool decided_;
  const RoundMembersOf members_of_;
  absl::Mutex mu_;
  std::map<std::string, Round> rounds_ ABSL_GUARDED_BY(mu_);  // by table
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);               // after Cancel: why no pull waits any more
};

// The waiter of `push`: its answer and its ids.
RowWaiter WaiterOf(const RowPush& push, RowAnswer done);
// The answer to `waiter` from the update it was in.
tessera::v1::RowPushResponse AnswerOf(const RowWaiter& waiter, const RowUpdateResult& result);

}  // namespace tessera

#endif  // TESSERA_SERVER_CONSISTENCY_ROW_ROUNDS_H_
