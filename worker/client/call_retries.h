// How a worker's calls to the servers are retried, dense chunks and rows alike. An attempt makes its calls and
// notes each failure in FailedCalls; a failure the caller must fix (a bad argument, a refused key) ends the
// run at once. The others are retried: a server that named a newer epoch (the view moved on: the map is
// refreshed from the scheduler first), and a server that did not answer (told to the scheduler, at most once a
// second per server, so that a lost one is replaced without waiting for its heartbeat timeout; its chunks may
// be elsewhere by the next attempt). Retries go on for at least `retries` attempts and `unavailable_window`,
// with a backoff, and stop at once when the job is stopping (and, for a step's calls, when it was rolled back).
#ifndef TESSERA_WORKER_CLIENT_CALL_RETRIES_H_
#define TESSERA_WORKER_CLIENT_CALL_RETRIES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/model/shard_map.h"

namespace tessera {

class SchedulerClient;

// What the failed calls of one attempt said.
class FailedCalls {
 public:
  // A call to `server_id` (as `map`, the view it was made under, names it) failed with `status`. Returns
  // `status` when it may not be retried (the caller must fix something), OK when it may.
  absl::Status Add(const absl::Status& status, const ShardMapIndex& map, int server_id);
  // A call that could not be made (UNAVAILABLE: a chunk on a server that left the view): retried after the map
  // is refreshed.
  void AddUnplaced(const absl::Status& status);

  bool any() const { return any_; }
  uint64_t newer_epoch() const { return newer_epoch_; }  // the newest epoch a server named; 0: none
  const absl::Status& last() const { return last_; }     // the last retryable error
  // Servers (id, incarnation) whose calls found no one answering, with one of their errors.
  const std::map<std::pair<int, uint64_t>, absl::Status>& unreachable() const { return unreachable_; }

 private:
  bool any_ = false;
  uint64_t newer_epoch_ = 0;
  absl::Status last_;
  std::map<std::pair<int, uint64_t>, absl::Status> unreachable_;
};

// Not thread-safe: the client's training loop runs it.
class CallRetries {
 public:
  struct Options {
    int retries = 8;                                        // attempts at least
    absl::Duration unavailable_window = absl::Seconds(30);  // and for at least this long
  };
  // Adopts the scheduler's map when it is newer than the client's and at least `at_least_epoch` (0: whatever is
  // newer); sets `*behind` when the scheduler is still older than that (PsClient::RefreshMap).
  using RefreshMap = std::function<absl::Status(uint64_t at_least_epoch, bool* behind)>;
  // The clock the job was rolled back to and the client has not taken yet (PsClient::TakeRollback), else nullopt.
  using PendingRollback = std::function<std::optional<int64_t>()>;

  // `scheduler` (not owned) outlives this.
  CallRetries(Options options, SchedulerClient* scheduler, int worker_id, RefreshMap refresh,
              PendingRollback rollback);

  // One attempt: makes the calls still to do and notes each failure in `failed`; a non-OK status ends the run
  // with it. Done when an attempt noted nothing.
  using Attempt = std::function<absl::Status(FailedCalls& failed)>;
  // Runs attempts until one succeeds; the last retryable error, annotated, when they run out. ABORTED when the
  // job is stopping, and with `void_on_rollback` when it was rolled back (the step's calls are void).
  absl::Status Run(const Attempt& attempt, bool void_on_rollback);

  // Tells the scheduler of `servers` (each at most once a second), unless the job is stopping (a job that is
  // over lets its servers go: one that does not answer then is leaving, not lost).
  void ReportUnreachable(const std::map<std::pair<int, uint64_t>, absl::Status>& servers);

 private:
  const Options options_;
  SchedulerClient* const scheduler_;
  const int worker_id_;
  const RefreshMap refresh_;
  const PendingRollback rollback_;
  std::map<int, absl::Time> reported_;  // when each server id was last reported unreachable
};

}  // namespace tessera

#endif  // TESSERA_WORKER_CLIENT_CALL_RETRIES_H_
