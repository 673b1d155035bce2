#include "scheduler/membership/member.h"

#include "absl/strings/str_cat.h"

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

}  // namespace tessera
