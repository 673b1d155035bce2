// Chunk copies moving between live servers, in two phases and without a rollback or a lost step (it subscribes
// to the cluster view's membership events as ServerRecovery does):
//   - a replacement (a server id registered again) takes a share: first it becomes a backup of the chunks short
//     of backups, then primaries move to it;
//   - a drained server's copies all move to the others, then it leaves the view and is told to exit.
// A move's first phase adds the new copy as a backup, which its primary fills while training goes on; once every
// new copy is filled the second phase switches the roles (ClusterView::BeginMoves, FinishMoves). Moves run on the
// coordinator's executor, one at a time, like recoveries.
#ifndef TESSERA_SCHEDULER_RECOVERY_SERVER_MOVES_H_
#define TESSERA_SCHEDULER_RECOVERY_SERVER_MOVES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/membership/cluster_view.h"
#include "scheduler/membership/membership_events.h"
#include "scheduler/recovery/server_recovery.h"

namespace tessera {

// Thread-safe: events may come from any thread; the work runs on the executor.
class ServerMoves {
 public:
  explicit ServerMoves(RecoveryParts parts) : parts_(parts) {}

  // Subscribed to the cluster view (after ServerRecovery, which first recovers a replaced server's old self).
  void OnMembership(const MembershipEvent& event);

  // Moves every copy `server` holds to the other servers in two phases, then tells it to exit. Runs on the
  // executor's thread (the caller's job). Returns what it did.
  absl::StatusOr<std::string> Drain(int server);

 private:
  // Executor task: a replacement (or a new server) takes a share of the chunks.
  void GiveShareTo(const Member& server);
  // Moves chunks in two phases, handing each view to the servers and waiting between the two until every new
  // copy is filled.
  absl::Status MoveInTwoPhases(const std::vector<ChunkMove>& moves);
  // Phase 1 ends once every primary's backups, the new copies among them, hold its chunks.
  absl::Status WaitUntilFilled();
  // A drained server, out of the view, gets its last view and is told to exit.
  void LetGo(const Member& drained, const tessera::v1::ShardMap& map);

  const RecoveryParts parts_;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_RECOVERY_SERVER_MOVES_H_
