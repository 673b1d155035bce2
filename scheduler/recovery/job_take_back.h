// A restarted scheduler taking its running job back from the members of the scheduler before it.
//
// The servers come back first (RegisterRequest.rejoin), each with the view it holds, which counts only once the
// caller's key matches the digest that view holds for the caller's own slot and incarnation (UNAUTHENTICATED
// before anything is kept otherwise; a second process for a slot already claimed with another key gets
// FAILED_PRECONDITION). Once every server of the newest view of the run most servers' views belong to is back
// (or 3 heartbeat intervals after the first), that view is the job's (ClusterView::Adopt; servers whose keys it
// does not hold are refused), the run's latest checkpoint is loaded for later recoveries, and the view goes to
// the servers under a new epoch. Workers come back with their clocks, which the gate takes. Nothing is restored
// or rolled back. Until the job is taken back, returning workers are answered UNAVAILABLE (they retry).
//
// Registrations afresh wait while the members of an interrupted run may still come back (a heartbeat timeout
// from the start, or while servers are coming back); the first one after that starts the job afresh, and a
// member coming back later is refused (FAILED_PRECONDITION: register anew).
//
// It has no membership event to follow: it is driven by the members' registrations, before the view has any.
#ifndef TESSERA_SCHEDULER_RECOVERY_JOB_TAKE_BACK_H_
#define TESSERA_SCHEDULER_RECOVERY_JOB_TAKE_BACK_H_

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/cluster.pb.h"
#include "proto/job.pb.h"
#include "scheduler/recovery/checkpointer.h"
#include "scheduler/gate/clock_table.h"
#include "scheduler/membership/cluster_view.h"
#include "scheduler/records/progress_records.h"
#include "scheduler/server_control.h"

namespace tessera {

// The coordinator's parts a take-back works with; none owned, all must outlive it.
struct TakeBackParts {
  const tessera::v1::JobSpec* job;
  ClusterView* view;
  ClockTable* clocks;
  ServerControl* servers;
  Checkpointer* checkpointer;
  ProgressRecords* records;
};

// Thread-safe; Take runs on the coordinator's executor.
class JobTakeBack {
 public:
  // `publish_view(why)` hands the current view to every server.
  JobTakeBack(TakeBackParts parts, absl::Duration heartbeat_interval,
              std::function<void(const std::string&)> publish_view)
      : parts_(parts), heartbeat_interval_(heartbeat_interval), publish_view_(std::move(publish_view)) {}

  // The run was interrupted: its members may come back until `until`, and nobody registers afresh before.
  void ExpectMembersUntil(absl::Time until);
  // A registration with no rejoin: OK when the job runs afresh (the first one starts it so), UNAVAILABLE (retry)
  // while the members of an interrupted run may still come back.
  absl::Status AdmitAfresh();
  // A member coming back (`request.rejoin()`, `key` the member key its call carries): its slot, or the error
  // to answer with. INVALID_ARGUMENT for a member with neither role or a slot outside the job;
  // FAILED_PRECONDITION for another job, or once the job started afresh. See ClusterView::Return for the slot
  // rules.
  absl::StatusOr<Member> Take(const tessera::v1::RegisterRequest& request, const std::string& key);
  // Neither taken back nor started afresh yet.
  bool Pending() const;

 private:
  // Taking back: the servers come back so far (their rejoins and keys).
  struct Returning {
    tessera::v1::RegisterRequest request;  // its view vouched for by its key
    std::string key;
    uint64_t arrival = 0;  // the order servers came back in
  };

  // The request names this job and a slot of it.
  absl::Status CheckReturn(const tessera::v1::RegisterRequest& request) const;
  // Before the take-back: a server's view, checked and kept. Returns the view to take once the servers it
  // names are back (or the window has passed); UNAVAILABLE (retry) while some are missing.
  absl::StatusOr<tessera::v1::ShardMap> Gather(const tessera::v1::RegisterRequest& request, const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The newest view among those of the run most returning servers' views belong to (a tie: the run brought
  // back first).
  const tessera::v1::ShardMap* ViewToTakeBack() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `view` as the job's and lets the servers gathered so far in; returns `caller`'s slot when it is one
  // of them (its own error otherwise).
  absl::StatusOr<Member> AdoptGathered(const tessera::v1::ShardMap& view, int caller) ABSL_LOCKS_EXCLUDED(mu_);
  // The newest checkpoint of the run taken back, for a server lost later without backups.
  void LoadRunsCheckpoint(const tessera::v1::ShardMap& view);
  // After the take-back: a member coming back takes its slot.
  absl::StatusOr<Member> ComeBack(const tessera::v1::RegisterRequest& request, const std::string& key);
  // A member taken back: the gate takes a worker's clock (and the clock it pushed every round from, see
  // ClockTable::Rejoin; negative: none before `clock`), the servers' control a server's key.
  void Returned(const Member& member, int64_t clock, int64_t pushed_from = -1);

  const TakeBackParts parts_;
  const absl::Duration heartbeat_interval_;
  const std::function<void(const std::string&)> publish_view_;

  mutable absl::Mutex mu_;
  // How the job began: afresh (a member registered with no rejoin) or taken back; neither until the first
  // registration.
  bool started_afresh_ ABSL_GUARDED_BY(mu_) = false;
  bool taken_back_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time afresh_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t next_return_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, Returning> returning_servers_ ABSL_GUARDED_BY(mu_);
  absl::Time gathering_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_RECOVERY_JOB_TAKE_BACK_H_
