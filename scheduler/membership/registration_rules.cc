#include "scheduler/membership/registration_rules.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/wire_limits.h"
#include "common/rpc/security.h"

namespace tessera {

absl::Status CheckRegistration(const tessera::v1::RegisterRequest& request) {
  const bool server = request.role() == tessera::v1::SERVER;
  if (!server && request.role() != tessera::v1::WORKER) {
    return absl::InvalidArgumentError("register: role must be SERVER or WORKER");
  }
  if (server && request.address().empty()) return absl::InvalidArgumentError("a server must register with its address");
  TESSERA_RETURN_IF_ERROR(CheckLength("register: address", request.address(), kMaxAddressBytes));
  TESSERA_RETURN_IF_ERROR(CheckLength("register: fabric address", request.fabric_address(), kMaxFabricAddressBytes));
  TESSERA_RETURN_IF_ERROR(CheckLength("register: hostname", request.hostname(), kMaxNameBytes));
  TESSERA_RETURN_IF_ERROR(CheckLength("register: device", request.device(), kMaxNameBytes));
  TESSERA_RETURN_IF_ERROR(CheckLength("register: control_key", request.control_key(), kMaxNameBytes));
  if (server && request.control_key().empty()) {
    return absl::InvalidArgumentError("a server must register with the key of its control calls");
  }
  if (!request.replication_key().empty() && (!server || request.replication_key().size() != 32)) {
    return absl::InvalidArgumentError(absl::StrCat("register: a replication key is a server's, of 32 bytes; got ",
                                                   request.replication_key().size(), " bytes"));
  }
  return absl::OkStatus();
}

void HoldSlot(Member& slot, const tessera::v1::RegisterRequest& request, std::string key, absl::Time now) {
  slot.state = MemberState::kAlive;
  slot.awaited = false;
  slot.address = request.address();
  slot.fabric_address = request.fabric_address();
  slot.hostname = request.hostname();
  slot.device = request.device();
  slot.last_seen = now;
  slot.key = std::move(key);
  slot.key_digest = KeyDigest(slot.key);
  slot.control_key = request.control_key();
  slot.replication_key = request.replication_key();
}

absl::StatusOr<Member*> ChooseSlot(const tessera::v1::RegisterRequest& request, std::vector<Member>& slots) {
  const bool server = request.role() == tessera::v1::SERVER;
  // A drained server's slot (done) may be taken by a new server.
  auto takeable = [server](const Member& m) {
    return m.state == MemberState::kVacant || m.state == MemberState::kLost || (server && m.state == MemberState::kDone);
  };
  Member* slot = nullptr;
  if (request.has_requested_id()) {
    const int id = request.requested_id();
    if (id < 0 || id >= static_cast<int>(slots.size())) {
      return absl::InvalidArgumentError(absl::StrCat("register: ", server ? "server" : "worker", " id ", id,
                                                     " asked for, but the job has ", slots.size(), " (0 to ",
                                                     static_cast<int>(slots.size()) - 1, ")"));
    }
    if (takeable(slots[id]) || slots[id].state == MemberState::kAlive) slot = &slots[id];
  }
  for (MemberState wanted : {MemberState::kVacant, MemberState::kLost, MemberState::kDone}) {
    for (Member& m : slots) {
      if (slot == nullptr && m.state == wanted && takeable(m)) slot = &m;
    }
  }
  return slot;
}

absl::Status NoFreeSlot(const tessera::v1::RegisterRequest& request, const std::vector<Member>& slots,
                        absl::Time now, absl::Duration suspect_after) {
  const bool server = request.role() == tessera::v1::SERVER;
  const char* role = server ? "server" : "worker";
  const char* flag = server ? "--id" : "--rank";
  const Member* suspect = nullptr;
  for (const Member& m : slots) {
    const bool same_host = !request.hostname().empty() && m.hostname == request.hostname();
    if ((same_host || now - m.last_seen > suspect_after) && (suspect == nullptr || m.last_seen < suspect->last_seen)) {
      suspect = &m;
    }
  }
  if (suspect != nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "all ", slots.size(), " ", role, "s are registered; ", suspect->Describe(), " was last heard ",
        absl::FormatDuration(absl::Trunc(now - suspect->last_seen, absl::Milliseconds(100))),
        " ago: waiting to take its place once it is declared lost (", flag, "=", suspect->id, " takes it at once)"));
  }
  const std::string who = server ? request.address() : request.hostname();
  return absl::ResourceExhaustedError(absl::StrCat("the job has all its ", slots.size(), " ", role,
                                                   "s alive and answering; no place for the ", role, " at ", who,
                                                   " (a restarted ", role, " takes its place with ", flag, ")"));
}

std::string WaitingSummary(const std::vector<Member>& servers, const std::vector<Member>& workers, absl::Time now,
                           absl::Duration timeout) {
  auto missing = [](const std::vector<Member>& slots) {
    int n = 0;
    for (const Member& m : slots) n += m.state == MemberState::kVacant || m.state == MemberState::kLost;
    return n;
  };
  const int missing_servers = missing(servers);
  const int missing_workers = missing(workers);
  if (missing_servers == 0 && missing_workers == 0) return "";
  auto count = [](int n, const char* one, const char* many) { return absl::StrCat(n, " more ", n == 1 ? one : many); };
  std::vector<std::string> parts;
  if (missing_servers > 0) parts.push_back(count(missing_servers, "server", "servers"));
  if (missing_workers > 0) parts.push_back(count(missing_workers, "worker", "workers"));
  std::string text = absl::StrCat("waiting for ", absl::StrJoin(parts, " and "));
  for (const std::vector<Member>* slots : {&servers, &workers}) {
    for (const Member& m : *slots) {
      if (m.state == MemberState::kVacant || m.state == MemberState::kDone) continue;
      const bool lost = m.state == MemberState::kLost || now - m.last_seen > timeout;
      absl::StrAppend(&text, "; ", m.Describe(), lost ? " lost, last heard " : " last heard ",
                      absl::ToInt64Seconds(now - m.last_seen), " s ago");
    }
  }
  return text;
}

}  // namespace tessera
