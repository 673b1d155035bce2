#include "scheduler/membership/membership_events.h"

namespace tessera {

const char* MembershipEventName(MembershipEvent::Kind kind) {
  switch (kind) {
    case MembershipEvent::kWorkerJoined:
      return "worker joined";
    case MembershipEvent::kWorkerRejoined:
      return "worker rejoined";
    case MembershipEvent::kWorkerDone:
      return "worker done";
    case MembershipEvent::kWorkerLost:
      return "worker lost";
    case MembershipEvent::kServerJoined:
      return "server joined";
    case MembershipEvent::kServerReplaced:
      return "server replaced";
    case MembershipEvent::kServerLost:
      return "server lost";
    case MembershipEvent::kChunksMoved:
      return "chunks moved";
    case MembershipEvent::kRolledBack:
      return "rolled back";
  }
  return "?";
}

}  // namespace tessera
