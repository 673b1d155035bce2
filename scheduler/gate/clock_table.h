// Every worker's clock, and the gate that holds a worker back until the consistency mode lets it go on.
//
// A worker's clock is the number of steps it has completed (its gradients of them sent; in SYNC a step's exchange
// may still be answering when the next clock is asked for). Before step c it calls
// Advance(worker, c). The gate opens when
//   SYNC    the slowest active worker has clock >= c        (lockstep)
//   SSP(s)  the slowest active worker has clock >= c - s    (at most s clocks apart)
//   ASYNC   always
// A worker that is Done (or removed) no longer holds anyone back. After Stop() every gate opens with `stop`.
//
// SYNC with k backup workers: a worker advances to c once it has sent every gradient of step c - 1. When
// M - k of the M active workers have done so, round c - 1 is decided: its members are those workers, the gate
// of c opens for them, and `on_round_decided` names them (the servers close the round with exactly those
// workers' gradients). A worker that advances to c after round c - 1 was decided without it is late: its
// gradients of that round are never applied, and its gate answers at once, sending it on to the round after
// the newest decided one. A worker is a member of round r only if it pushed it: r < its clock, and r at or past
// the clock it pushed every round from (its start, its last late answer, the last rollback, or what it says when
// it rejoins), so that a table that decides rounds again (a restarted scheduler's) leaves out the rounds a late
// answer made it skip.
#ifndef TESSERA_SCHEDULER_GATE_CLOCK_TABLE_H_
#define TESSERA_SCHEDULER_GATE_CLOCK_TABLE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scheduler/membership/membership_events.h"

namespace tessera {

struct GateResult {
  int64_t min_clock = 0;  // slowest active worker when the gate opened
  bool stop = false;
  std::string stop_reason;
  std::optional<int64_t> rolled_back_to;  // the job went back to this clock (before the worker knew)
  // SYNC with backup workers: the worker's round was decided without it; it goes on at this clock.
  std::optional<int64_t> late_next_clock;
  // With rolled_back_to: the rollback's number (the cluster view's rollback_generation).
  uint64_t rollback_generation = 0;
};

// SYNC with backup workers: the workers whose gradients make one round.
struct RoundMembers {
  int64_t round = 0;
  std::vector<int> members;  // ascending
  std::vector<int> late;     // active workers left out, ascending
};

// Thread-safe. Callbacks run without the table's lock held, on the caller's thread (gate already open) or on the
// thread whose Advance/Done/Stop opened it, or on the table's deadline thread.
class ClockTable {
 public:
  using Callback = std::function<void(absl::StatusOr<GateResult>)>;

  // `bound`: -1 for ASYNC (no gate), 0 for SYNC, s for SSP(s). `backups`: SYNC only, backup workers per round;
  // `on_round_decided` (with backups) runs for every decided round, in round order, without the table's lock.
  ClockTable(int num_workers, int bound, int backups = 0,
             std::function<void(const RoundMembers&)> on_round_decided = nullptr);
  ~ClockTable();

  ClockTable(const ClockTable&) = delete;
  ClockTable& operator=(const ClockTable&) = delete;

  // Records that `worker` completed `clock` steps and calls `done` exactly once: when it may start step
  // `clock`, when the job stops, at `deadline` with DEADLINE_EXCEEDED naming the workers it waits for, with
  // CANCELLED once `cancelled` (asked about once a second) says the caller gave up, or with ABORTED when the
  // same worker advances again (a worker waits at one gate at a time). INVALID_ARGUMENT (through `done`) for a
  // worker id out of range, or a clock that goes backwards or skips ahead: a worker advances one step at a time
  // (after a rollback, from the rollback's clock).
  void Advance(int worker, int64_t clock, absl::Time deadline, Callback done,
               std::function<bool()> cancelled = nullptr);

  // `worker` has finished or was lost: it no longer holds the others back.
  void Done(int worker);

  // `worker` is back (a new incarnation of a lost rank, or a worker taken back by a restarted scheduler), at
  // `clock`: it holds the others back again. The clock may be lower or higher than its last one.
  // `pushed_from` (SYNC with backups): the worker pushed every round in [pushed_from, clock), and is a member
  // of no undecided round before pushed_from (a late answer sent it past them). Negative (the default): it
  // pushed none before `clock`; a value above `clock` counts as `clock`; 0 (a worker that does not say): every
  // round before `clock`.
  void Rejoin(int worker, int64_t clock, int64_t pushed_from = -1);
  // Subscribed to the cluster view: a worker done or lost leaves the gate (Done); a returning one is held one
  // clock below its start (Rejoin), until the coordinator has handed the servers the view with it and admits
  // it at its start.
  void OnMembership(const MembershipEvent& event);

  // Holds every worker `ahead` steps after the newest any worker has started (1: before the step after it):
  // Advance to a clock >= the returned one waits (deadlines still apply) until Release(). SYNC checkpoints use
  // it for a consistent cut: every worker completes exactly the returned number of steps, and no more, while
  // held. With ahead = 2 no worker has been let into the step before the cut yet, so that the answers letting
  // them in can announce the cut (HeldAt): what the script's optimizer needs to save its values in time.
  int64_t Hold(int ahead = 1);
  void Release();
  // The clock every worker is held before (Hold, RollBack), or -1 when none is.
  int64_t HeldAt() const;

  // Rollback number `generation` of the job, to `clock`: every active worker's clock goes back to `clock`, and
  // every gate holds at clock + 1 until Release() (the servers are restored meanwhile). A worker that waits is
  // answered with rolled_back_to = clock at once; one that advances before it knows of the rollback (any clock
  // but clock + 1) gets the same answer instead of an error, until it advances to clock + 1. Call before the
  // rollback is published anywhere else (the cluster view), so no worker can act on it before the table does.
  void RollBack(int64_t clock, uint64_t generation);

  // Opens every gate, now and later, with stop = true.
  void Stop(const std::string& reason);

  std::vector<int64_t> Clocks() const;
  // SYNC with backup workers: the newest decided rounds (at most kRoundsKept, oldest first), and how many rounds
  // each worker was late for.
  std::vector<RoundMembers> RecentRounds() const;
  std::vector<int64_t> LateRounds() const;
  static constexpr size_t kRoundsKept = 64;
  // The clocks of the workers still holding others back (not done, not lost).
  std::vector<int64_t> ActiveClocks() const;
  bool stopped() const;
  std::string stop_reason() const;

 private:
  struct Waiter {
    int worker;
    int64_t clock;
    absl::Time deadline;
    Callback done;
    std::function<bool()> cancelled;
  };
  using Ready = std::vector<std::pair<Callback, absl::StatusOr<GateResult>>>;

  bool GateOpenLocked(int64_t clock) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Active workers at `clock` or beyond.
  int AtOrPastLocked(int64_t clock) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With backups: decides every round that M - k workers have finished, in order, into `decided`.
  void DecideRoundsLocked(std::vector<RoundMembers>& decided) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Announce(const std::vector<RoundMembers>& decided) const;
  int64_t MinActiveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the waiters whose gate is open (or whose deadline passed) into `ready`.
  void CollectLocked(absl::Time now, Ready& ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string StragglersLocked(int64_t clock) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunDeadlines();

  const int bound_;
  const int backups_;
  const std::function<void(const RoundMembers&)> on_round_decided_;

  mutable absl::Mutex mu_;
  std::vector<int64_t> clocks_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> active_ ABSL_GUARDED_BY(mu_);
  // With backups: each worker pushed every round in [pushed_from_, clocks_), and is a member of none before.
  std::vector<int64_t> pushed_from_ ABSL_GUARDED_BY(mu_);
  std::list<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t waiters_added_ ABSL_GUARDED_BY(mu_) = 0;  // wakes the deadline thread for a new, maybe earlier, one
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t hold_at_ ABSL_GUARDED_BY(mu_) = -1;  // -1: no hold
  int64_t rolled_back_to_ ABSL_GUARDED_BY(mu_) = -2;  // the last rollback's clock
  uint64_t rollback_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<bool> owes_rollback_ ABSL_GUARDED_BY(mu_);  // has not advanced since the last rollback
  std::deque<RoundMembers> rounds_ ABSL_GUARDED_BY(mu_);   // decided rounds, oldest first
  int64_t newest_decided_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int64_t> late_rounds_ ABSL_GUARDED_BY(mu_);
  std::thread deadline_thread_;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_GATE_CLOCK_TABLE_H_
