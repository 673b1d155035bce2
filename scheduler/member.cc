#include "scheduler/member.h"

#include "absl/strings/str_cat.h"
#include "scheduler/membership_events.h"

namespace tessera {

const char* MemberStateName(MemberState state) {
  switch (state) {
    case MemberState::kVacant:
      return "vacant";
    case MemberState::kAlive:
      return "alive";
    case MemberState::kLost:
      return "lost";
    case MemberState::kDone:
      return "done";
  }
  return "?";
}

std::string Member::Describe() const {
  const char* name = role == tessera::v1::SERVER ? "server" : "worker";
  if (!address.empty()) return absl::StrCat(name, " ", id, " at ", address);
  if (!hostname.empty()) return absl::StrCat(name, " ", id, " on ", hostname);
  return absl::StrCat(name, " ", id);
}

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
