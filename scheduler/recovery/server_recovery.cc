#include "scheduler/recovery/server_recovery.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"

namespace tessera {

ServerRecovery::ServerRecovery(RecoveryParts parts, absl::Duration heartbeat_timeout,
                               std::function<absl::StatusOr<CheckpointInfo>(const std::string&)> take_checkpoint,
                               std::function<void(const std::string&)> fail_job)
    : parts_(parts),
      heartbeat_timeout_(heartbeat_timeout),
      take_checkpoint_(std::move(take_checkpoint)),
      fail_job_(std::move(fail_job)) {}

void ServerRecovery::OnMembership(const MembershipEvent& event) {
  if (event.kind == MembershipEvent::kServerLost) {
    if (event.failure.empty()) {
      ServerLost(event.member, absl::Now() - heartbeat_timeout_,
                 absl::StrCat("no heartbeat for ", absl::FormatDuration(heartbeat_timeout_)));
    } else {
      ServerLost(event.member, absl::Now(), event.failure);
    }
  } else if (event.kind == MembershipEvent::kServerReplaced && parts_.view->placed()) {
    // A restarted server that took its id back before the old one was declared lost: the old one is lost now.
    // Its chunks move to the others (restored from the checkpoint), then the newcomer takes a share.
    if (event.was == MemberState::kAlive) {
      Member old = event.member;
      old.incarnation -= 1;
      old.address = event.previous_address;
      ServerLost(old, absl::Now(), "a new process took its id");
    }
    // The newcomer's share: ServerMoves.
  }
}

void ServerRecovery::ServerLost(const Member& lost, absl::Time lost_at, const std::string& why) {
  const std::string what = absl::StrCat(lost.Describe(), " lost: ", why);
  if (!parts_.view->placed()) {
    LOG(WARNING) << what << " before the job started; its place waits for a replacement";
    return;
  }
  std::optional<CheckpointInfo> latest = parts_.checkpointer->latest();
  if (parts_.view->backups() > 0) {
    // Backups take over; a checkpoint is needed only for chunks that lost every copy.
    LOG(WARNING) << what << "; backups take over its chunks";
    parts_.executor->Submit([this, lost, latest, lost_at] { Recover(lost, latest, lost_at); });
    return;
  }
  if (latest) {
    LOG(WARNING) << what << "; its chunks move to the other servers, restored from checkpoint " << latest->folder
                 << " (clock " << latest->state.clock() << ")";
    parts_.executor->Submit([this, lost, latest, lost_at] { Recover(lost, latest, lost_at); });
    return;
  }
  fail_job_(absl::StrCat(what, "; its chunks cannot be restored without a checkpoint, so the job stops"));
}

void ServerRecovery::Recover(const Member& lost, const std::optional<CheckpointInfo>& checkpoint,
                             absl::Time lost_at) {
  const absl::Time start = absl::Now();
  const std::string from = checkpoint ? checkpoint->folder : "no checkpoint";
  auto fail = [&](const absl::Status& why) {
    fail_job_(absl::StrCat(lost.Describe(), " lost and its chunks could not be restored from ", from, ": ",
                           why.message()));
  };
  absl::StatusOr<ChunkMoves> moves = parts_.view->MoveChunksOf(lost.id);
  if (!moves.ok()) return fail(moves.status());
  if (moves->moved.empty()) return BackupsTookOver(lost, moves->promoted.size(), start, lost_at);
  if (!checkpoint) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        moves->moved.size(), " of its chunks had no live backup and there is no checkpoint to restore them from")));
  }
  const std::vector<tessera::v1::ChunkPlacement>& moved = moves->moved;
  const bool sync = parts_.rules->consistent_cut;
  const int64_t clock = checkpoint->state.clock();
  const std::vector<int64_t> before = parts_.clocks->Clocks();
  if (sync) {
    // The clock table first, holding every worker at clock + 1: once the view says "rolled back", a worker that
    // reads it may advance from `clock` at once, and the table must already be there (a worker whose clock the
    // table set back after it had advanced was refused as a jump and died).
    parts_.clocks->RollBack(clock, parts_.view->rollback_generation() + 1);
    parts_.view->RollBack(clock);
  }
  std::optional<tessera::v1::ShardMap> map = parts_.view->Map();
  // SYNC: every chunk goes back to the checkpoint; ASYNC and SSP: only the moved chunks come back, with their
  // checkpoint versions, and the others keep going.
  if (absl::Status s = parts_.servers->Assign(*map, *parts_.job, checkpoint->shard_files, /*restore_all=*/sync);
      !s.ok()) {
    return fail(s);
  }
  if (sync) parts_.clocks->Release();  // the servers hold the checkpoint's values: on from `clock`
  const int64_t newest = before.empty() ? 0 : *std::max_element(before.begin(), before.end());
  LOG(WARNING) << "recovered from the loss of " << lost.Describe() << ": " << moved.size()
               << " chunks moved to the other servers at cluster view epoch " << map->epoch()
               << (sync ? absl::StrCat(", every worker back to clock ", clock, " from ", newest) : "") << ", "
               << absl::FormatDuration(absl::Now() - start) << " to restore";
  parts_.records->AddEvent({{"event", "server lost, recovered"},
                            {"server", lost.id},
                            {"address", lost.address},
                            {"chunks_moved", moved.size()},
                            {"chunks_promoted", moves->promoted.size()},
                            {"checkpoint", checkpoint->folder},
                            {"rolled_back_to", sync ? nlohmann::json(clock) : nlohmann::json()},
                            {"clocks_lost", sync ? newest - clock : 0},
                            {"seconds_lost", absl::ToDoubleSeconds(absl::Now() - lost_at)}});
}

void ServerRecovery::BackupsTookOver(const Member& lost, size_t promoted, absl::Time start, absl::Time lost_at) {
  std::optional<tessera::v1::ShardMap> map = parts_.view->Map();
  if (absl::Status s = parts_.servers->Assign(*map, *parts_.job); !s.ok()) {
    // The servers that took the view serve it; one that did not answer is found by the failure detector.
    LOG(WARNING) << "handing the view without " << lost.Describe() << " to the servers: " << s;
  }
  LOG(WARNING) << "recovered from the loss of " << lost.Describe() << ": backups took over " << promoted
               << " chunks at cluster view epoch " << map->epoch() << ", "
               << absl::FormatDuration(absl::Now() - start) << " after the loss was detected";
  parts_.records->AddEvent({{"event", "server lost, backups took over"},
                            {"server", lost.id},
                            {"address", lost.address},
                            {"chunks_promoted", promoted},
                            {"clocks_lost", 0},
                            {"failover_seconds", absl::ToDoubleSeconds(absl::Now() - start)},
                            {"seconds_lost", absl::ToDoubleSeconds(absl::Now() - lost_at)}});
}

}  // namespace tessera
