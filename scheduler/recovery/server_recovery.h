// What the scheduler does for the servers of a placed job when one is lost or replaced (it subscribes to the
// cluster view's membership events):
//   - with replication (ReplicationSpec.backups > 0), a backup takes over each chunk the lost server was primary
//     of, at the same version: no restore and no rollback in any mode; chunks short of backups get new ones,
//     filled by their primaries while training goes on. Only a chunk that lost every copy falls back to the
//     checkpoint, as below;
//   - a lost server's chunks move to the servers left and are restored from the latest checkpoint; in SYNC
//     every chunk and every worker go back to it (a sync round is one cut of the whole model), in ASYNC and SSP
//     only the moved chunks do, and the others keep going. Without a checkpoint they cannot come back, and the
//     job stops naming the server;
//   - a replacement (a server id registered again) whose old self was still thought alive: that one is lost
//     first (its share of the chunks then comes from ServerMoves, server_moves.h).
// A server lost before the parameters are placed leaves its slot to a replacement; nothing moves.
#ifndef TESSERA_SCHEDULER_RECOVERY_SERVER_RECOVERY_H_
#define TESSERA_SCHEDULER_RECOVERY_SERVER_RECOVERY_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/thread_pool.h"
#include "proto/job.pb.h"
#include "scheduler/recovery/checkpointer.h"
#include "scheduler/gate/clock_table.h"
#include "scheduler/membership/cluster_view.h"
#include "scheduler/membership/membership_events.h"
#include "scheduler/gate/mode_rules.h"
#include "scheduler/records/progress_records.h"
#include "scheduler/server_control.h"

namespace tessera {

// The coordinator's parts a recovery works with; none owned, all must outlive it.
struct RecoveryParts {
  const tessera::v1::JobSpec* job;
  const ModeRules* rules;
  ClusterView* view;
  ClockTable* clocks;
  ServerControl* servers;
  Checkpointer* checkpointer;
  ProgressRecords* records;
  SerialExecutor* executor;  // the coordinator's: recoveries run there, one at a time
};

// Thread-safe: events may come from any thread; the work runs on the executor.
class ServerRecovery {
 public:
  // `take_checkpoint(why)` takes a checkpoint now, leaving SYNC workers held at its clock (released here);
  // `fail_job(reason)` records that the job cannot complete and stops it. A member lost was silent for
  // `heartbeat_timeout`.
  ServerRecovery(RecoveryParts parts, absl::Duration heartbeat_timeout,
                 std::function<absl::StatusOr<CheckpointInfo>(const std::string&)> take_checkpoint,
                 std::function<void(const std::string&)> fail_job);

  // Subscribed to the cluster view.
  void OnMembership(const MembershipEvent& event);

 private:
  // Queues the recovery of `lost` (lost at `lost_at`, `why`), or stops the job when nothing can bring its chunks
  // back.
  void ServerLost(const Member& lost, absl::Time lost_at, const std::string& why);
  // Executor task: backups take over the lost server's chunks; chunks without a live copy move and are
  // restored from `checkpoint`.
  void Recover(const Member& lost, const std::optional<CheckpointInfo>& checkpoint, absl::Time lost_at);
  // Every chunk the lost server was primary of had a backup, now its primary at the same version: the view
  // goes to the servers, with no restore and no rollback.
  void BackupsTookOver(const Member& lost, size_t promoted, absl::Time start, absl::Time lost_at);

  const RecoveryParts parts_;
  const absl::Duration heartbeat_timeout_;
  const std::function<absl::StatusOr<CheckpointInfo>(const std::string&)> take_checkpoint_;
  const std::function<void(const std::string&)> fail_job_;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_RECOVERY_SERVER_RECOVERY_H_
