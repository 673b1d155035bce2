// A change of a job's members or of where its chunks live, as ClusterView publishes it. The parts that care
// subscribe (ClusterView::Subscribe) instead of the coordinator telling each of them by hand:
//
//   ClockTable       a worker that left or was lost leaves the gate; a returning one is held below its start
//   BatchBalancer    a worker that left or was lost leaves the split of a round's batch; one that joins is in it
//   ProgressRecords  the run's event log (lost, failed, rejoined, replaced)
//   ServerRecovery   a lost server's chunks move and are restored; a replacement takes a share
//   JobCoordinator   hands the new view to the servers, and ends the job once no worker is left
#ifndef TESSERA_SCHEDULER_MEMBERSHIP_MEMBERSHIP_EVENTS_H_
#define TESSERA_SCHEDULER_MEMBERSHIP_MEMBERSHIP_EVENTS_H_

#include <functional>
#include <string>
#include <vector>

#include "proto/cluster.pb.h"
#include "scheduler/membership/member.h"

namespace tessera {

struct MembershipEvent {
  enum Kind {
    kWorkerJoined,    // a rank taken for the first time
    kWorkerRejoined,  // a rank taken again, by a new incarnation (its old one lost, or still thought alive)
    kWorkerDone,      // a worker finished
    kWorkerLost,      // silent for the heartbeat timeout, or stopped on an error (`failure`)
    kServerJoined,    // a server id taken for the first time
    kServerReplaced,  // a server id taken again, by a new incarnation
    kServerLost,      // silent for the heartbeat timeout
    kChunksMoved,     // `chunks` moved: off lost server `member.id`, or onto replacement `member.id`
    kRolledBack,      // SYNC: every worker goes on from `clock` (a lost server's chunks came from a checkpoint)
  };
  Kind kind;
  Member member;             // as it is after the change (for chunk moves: the server they left or joined)
  MemberState was = MemberState::kVacant;  // joins: the slot's state before
  std::string previous_address;            // joins: the slot's previous holder's address
  // kWorkerLost: the error the worker stopped on; kServerLost: why it was declared lost before its heartbeat
  // timeout (no worker, nor the scheduler, could reach it). Empty: it fell silent.
  std::string failure;
  std::vector<tessera::v1::ChunkPlacement> chunks;  // kChunksMoved
  int64_t clock = 0;                                // kRolledBack
};

// "worker lost", "chunks moved", ...
const char* MembershipEventName(MembershipEvent::Kind kind);

// Called on the thread that made the change, after the view's lock is released, in subscription order.
using MembershipListener = std::function<void(const MembershipEvent&)>;

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_MEMBERSHIP_MEMBERSHIP_EVENTS_H_
