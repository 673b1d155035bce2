#include "scheduler/membership/cluster_view.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include <algorithm>
#include <map>
#include <set>

#include "common/rpc/security.h"
#include "common/model/shard_map.h"
#include "common/base/status_macros.h"
#include "common/model/wire_limits.h"

namespace tessera {

namespace {
// What every registration (a first one, or a member coming back) must hold: a known role, the lengths
// common/model/wire_limits.h allows, and for a server its address and the key of its control calls.
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

// `slot` is held from `now` by the member of `request`, alive, with member key `key`.
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

// The slot a registration takes (see ClusterView::Join), or nullptr when every slot of its role is held.
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

// Why a registration finds every slot of its role held: UNAVAILABLE naming the member heard from longest ago
// among those silent for longer than `suspect_after` or on the registrant's host (most likely the registrant's
// own earlier self, killed and restarted before it is declared lost); RESOURCE_EXHAUSTED otherwise.
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
}  // namespace

ClusterView::ClusterView(int num_servers, int num_workers, int backups)
    : num_servers_(num_servers),
      num_workers_(num_workers),
      backups_(backups),
      servers_(num_servers),
      workers_(num_workers) {
  for (int i = 0; i < num_servers; ++i) {
    servers_[i].role = tessera::v1::SERVER;
    servers_[i].id = i;
  }
  for (int i = 0; i < num_workers; ++i) {
    workers_[i].role = tessera::v1::WORKER;
    workers_[i].id = i;
  }
}

void ClusterView::Subscribe(MembershipListener listener) {
  absl::MutexLock lock(&listeners_mu_);
  listeners_.push_back(std::move(listener));
}

void ClusterView::Publish(const std::vector<MembershipEvent>& events) {
  std::vector<MembershipListener> listeners;
  {
    absl::MutexLock lock(&listeners_mu_);
    listeners = listeners_;
  }
  for (const MembershipEvent& event : events) {
    for (const MembershipListener& listener : listeners) listener(event);
  }
}

absl::StatusOr<ClusterView::Joined> ClusterView::Join(const tessera::v1::RegisterRequest& request, absl::Time now,
                                                      const std::function<int64_t(const Member&)>& start_clock,
                                                      absl::Duration suspect_after) {
  absl::StatusOr<Joined> joined = JoinSlot(request, now, start_clock, suspect_after);
  if (!joined.ok()) return joined;
  MembershipEvent event;
  const bool server = joined->member.role == tessera::v1::SERVER;
  const bool first = joined->was == MemberState::kVacant;
  event.kind = server ? (first ? MembershipEvent::kServerJoined : MembershipEvent::kServerReplaced)
                      : (first ? MembershipEvent::kWorkerJoined : MembershipEvent::kWorkerRejoined);
  event.member = joined->member;
  event.was = joined->was;
  event.previous_address = joined->previous_address;
  Publish({event});
  return joined;
}

absl::StatusOr<ClusterView::Joined> ClusterView::JoinSlot(const tessera::v1::RegisterRequest& request,
                                                          absl::Time now,
                                                          const std::function<int64_t(const Member&)>& start_clock,
                                                          absl::Duration suspect_after) {
  TESSERA_RETURN_IF_ERROR(CheckRegistration(request));
  const bool server = request.role() == tessera::v1::SERVER;
  if (server && backups_ > 0 && request.replication_key().empty()) {
    return absl::InvalidArgumentError("a server of a job with backups registers with its replication key");
  }
  absl::MutexLock lock(&mu_);
  std::vector<Member>& slots = server ? servers_ : workers_;
  TESSERA_ASSIGN_OR_RETURN(Member * slot, ChooseSlot(request, slots));
  if (slot == nullptr) return NoFreeSlot(request, slots, now, suspect_after);
  if (slot->incarnation >= kMaxIncarnation) {
    // Never reached by restarts (one a second for 30,000 years); an incarnation never wraps.
    return absl::ResourceExhaustedError(absl::StrCat(slot->Describe(), " has had ", kMaxIncarnation,
                                                     " incarnations, the most a slot may have"));
  }
  const MemberState was = slot->state;
  const std::string previous_address = slot->address;
  slot->joined_clock = server ? 0 : start_clock(*slot);
  slot->incarnation += 1;
  HoldSlot(*slot, request, NewSecret(), now);
  slot->unanswered = true;
  // Servers take a worker's pushes only with its key, whose digest comes with the view: every registration
  // after placement is a new view.
  ChangedLocked();
  return Joined{*slot, was, previous_address};
}

void ClusterView::Restore(const tessera::v1::ShardMap& view) {
  absl::MutexLock lock(&mu_);
  placement_ = view;
  placement_->clear_servers();
  placement_->clear_workers();
  for (const auto& s : view.servers()) {
    if (s.id() >= 0 && s.id() < static_cast<int>(servers_.size())) servers_[s.id()].incarnation = s.incarnation();
  }
  for (const auto& w : view.workers()) {
    if (w.id() >= 0 && w.id() < static_cast<int>(workers_.size())) workers_[w.id()].incarnation = w.incarnation();
  }
  epoch_ = view.epoch() + 1;
}

absl::Status ClusterView::Touch(tessera::v1::Role role, int id, uint64_t incarnation, absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<Member>* slots = role == tessera::v1::SERVER ? &servers_ : role == tessera::v1::WORKER ? &workers_ : nullptr;
  if (slots == nullptr) return absl::InvalidArgumentError("heartbeat: role must be SERVER or WORKER");
  if (id < 0 || id >= static_cast<int>(slots->size()) || (*slots)[id].state == MemberState::kVacant) {
    return absl::NotFoundError(absl::StrCat("no ", tessera::v1::Role_Name(role), " with id ", id, " registered"));
  }
  Member& m = (*slots)[id];
  if (incarnation != 0 && incarnation != m.incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(m.Describe(), " incarnation ", incarnation,
                                                      " was replaced by incarnation ", m.incarnation));
  }
  if (m.state == MemberState::kLost) {
    return absl::FailedPreconditionError(
        absl::StrCat(m.Describe(), " was declared lost (silent for longer than the heartbeat timeout); register "
                                   "again to rejoin"));
  }
  m.last_seen = now;
  return absl::OkStatus();
}

absl::Status ClusterView::CheckMemberKey(tessera::v1::Role role, int id, absl::string_view key) const {
  absl::MutexLock lock(&mu_);
  const std::vector<Member>* slots = role == tessera::v1::SERVER   ? &servers_
                                     : role == tessera::v1::WORKER ? &workers_
                                                                   : nullptr;
  if (slots == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("role ", static_cast<int>(role), " is neither SERVER nor WORKER"));
  }
  if (id < 0 || id >= static_cast<int>(slots->size())) {
    return absl::InvalidArgumentError(absl::StrCat(role == tessera::v1::SERVER ? "server" : "worker", " id ", id,
                                                   " is outside the job (0 to ", slots->size() - 1, ")"));
  }
  const Member& m = (*slots)[id];
  if (m.state == MemberState::kVacant || m.awaited) {
    return absl::NotFoundError(absl::StrCat(m.Describe(), m.awaited ? " has not come back to the restarted scheduler"
                                                                     : " has not registered",
                                            ": register first"));
  }
  return CheckSecret(key, m.key, absl::StrCat("a call for ", m.Describe()));
}

void ClusterView::Adopt(const tessera::v1::ShardMap& view, absl::Time now) {
  absl::MutexLock lock(&mu_);
  const bool placed = view.params_size() > 0;
  if (placed) {
    placement_ = view;
    placement_->clear_servers();
    placement_->clear_workers();
    epoch_ = view.epoch();
    rollback_generation_ = view.rollback_generation();
    rollback_clock_ = view.rollback_clock();
  }
  auto await = [now](Member& m, uint64_t incarnation, const std::string& key_digest) {
    m.incarnation = incarnation;
    m.state = MemberState::kAlive;
    m.awaited = true;
    m.last_seen = now;
    m.key.clear();
    m.key_digest = key_digest;
  };
  for (const auto& s : view.servers()) {
    if (s.id() < 0 || s.id() >= static_cast<int>(servers_.size())) continue;
    Member& m = servers_[s.id()];
    await(m, s.incarnation(), s.key_digest());
    m.address = s.address();
    m.fabric_address = s.fabric_address();
    m.replication_key = s.replication_key();
  }
  if (placed) {
    for (Member& m : servers_) {
      if (m.state == MemberState::kVacant) m.state = MemberState::kLost;  // left the job before the restart
    }
  }
  for (const auto& w : view.workers()) {
    if (w.id() < 0 || w.id() >= static_cast<int>(workers_.size()) || w.incarnation() == 0) continue;
    Member& m = workers_[w.id()];
    m.joined_clock = w.joined_clock();
    if (w.active()) {
      await(m, w.incarnation(), w.key_digest());
    } else {
      m.incarnation = w.incarnation();
      m.state = MemberState::kLost;
    }
  }
  ++changes_;
}

absl::StatusOr<Member> ClusterView::Return(const tessera::v1::RegisterRequest& request, std::string_view key,
                                           absl::Time now) {
  TESSERA_RETURN_IF_ERROR(CheckRegistration(request));
  const bool server = request.role() == tessera::v1::SERVER;
  if (key.empty()) return absl::UnauthenticatedError("a member comes back with the member key it was given");
  if (server && backups_ > 0 && request.replication_key().empty()) {
    return absl::InvalidArgumentError("a server of a job with backups comes back with its replication key");
  }
  absl::MutexLock lock(&mu_);
  std::vector<Member>& slots = server ? servers_ : workers_;
  const int id = request.has_requested_id() ? request.requested_id() : -1;
  if (id < 0 || id >= static_cast<int>(slots.size())) {
    return absl::InvalidArgumentError(absl::StrCat("register: a member comes back to its own slot; ", id,
                                                   " is outside the job (0 to ", slots.size() - 1, ")"));
  }
  Member& m = slots[id];
  const uint64_t incarnation = request.rejoin().incarnation();
  const int64_t clock = request.rejoin().clock();
  if (incarnation == 0 || incarnation > kMaxIncarnation || clock < 0 || clock > kMaxClock) {
    return absl::InvalidArgumentError(absl::StrCat(m.Describe(), " comes back with incarnation ", incarnation,
                                                   " at clock ", clock, "; incarnations are 1 .. ", kMaxIncarnation,
                                                   ", clocks 0 .. ", kMaxClock));
  }
  if (m.awaited && incarnation < m.incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(m.Describe(), " incarnation ", incarnation,
                                                      " was replaced by incarnation ", m.incarnation));
  }
  if (m.awaited) {
    // A slot the view taken back holds for an incarnation goes to that incarnation's key only, whatever
    // incarnation the caller names: a newer one cannot be told from a forgery.
    TESSERA_RETURN_IF_ERROR(CheckSecret(KeyDigest(std::string(key)), m.key_digest, absl::StrCat(m.Describe(), " coming back")));
    if (incarnation != m.incarnation) {
      return absl::InvalidArgumentError(absl::StrCat(m.Describe(), " holds incarnation ", m.incarnation,
                                                     "; its key came back as incarnation ", incarnation));
    }
  } else if (m.state == MemberState::kAlive && incarnation == m.incarnation &&
             CheckSecret(absl::string_view(key.data(), key.size()), m.key, "").ok()) {
    // Back already (its earlier try was answered while the job was being taken back): the same again.
  } else if (m.state == MemberState::kAlive) {
    return absl::FailedPreconditionError(absl::StrCat(m.Describe(), " is held by incarnation ", m.incarnation,
                                                      " registered with this scheduler"));
  } else if (incarnation < m.incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(m.Describe(), " incarnation ", incarnation,
                                                      " was replaced by incarnation ", m.incarnation));
  }
  m.incarnation = incarnation;
  HoldSlot(m, request, std::string(key), now);
  if (!server) m.joined_clock = std::min(m.joined_clock, clock);
  ++changes_;
  return m;
}

void ClusterView::AdvanceEpochPast(uint64_t seen) {
  absl::MutexLock lock(&mu_);
  if (!placement_) return;
  epoch_ = std::max(epoch_, seen) + 1;
  ++changes_;
}

void ClusterView::Answered(tessera::v1::Role role, int id, uint64_t incarnation, absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<Member>& slots = role == tessera::v1::SERVER ? servers_ : workers_;
  if (id < 0 || id >= static_cast<int>(slots.size()) || slots[id].incarnation != incarnation) return;
  slots[id].unanswered = false;
  slots[id].last_seen = now;
}

std::vector<Member> ClusterView::MarkSilentLost(absl::Time now, absl::Duration timeout) {
  std::vector<Member> lost;
  {
    absl::MutexLock lock(&mu_);
    for (std::vector<Member>* slots : {&servers_, &workers_}) {
      for (Member& m : *slots) {
        if (m.state != MemberState::kAlive || m.unanswered || now - m.last_seen <= timeout) continue;
        m.state = MemberState::kLost;
        m.awaited = false;
        lost.push_back(m);
      }
    }
    if (!lost.empty()) ChangedLocked();
  }
  std::vector<MembershipEvent> events;
  for (const Member& m : lost) {
    MembershipEvent event;
    event.kind = m.role == tessera::v1::SERVER ? MembershipEvent::kServerLost : MembershipEvent::kWorkerLost;
    event.member = m;
    events.push_back(std::move(event));
  }
  Publish(events);
  return lost;
}

std::optional<Member> ClusterView::Leave(int worker, MemberState state, const std::string& failure) {
  MembershipEvent event;
  {
    absl::MutexLock lock(&mu_);
    if (worker < 0 || worker >= static_cast<int>(workers_.size()) || workers_[worker].state != MemberState::kAlive) {
      return std::nullopt;
    }
    workers_[worker].state = state;
    workers_[worker].awaited = false;
    if (state == MemberState::kLost) ChangedLocked();
    event.kind = state == MemberState::kLost ? MembershipEvent::kWorkerLost : MembershipEvent::kWorkerDone;
    event.member = workers_[worker];
    event.failure = failure;
  }
  Publish({event});
  return event.member;
}

std::optional<Member> ClusterView::MarkServerLost(int id, uint64_t incarnation, const std::string& why) {
  MembershipEvent event;
  {
    absl::MutexLock lock(&mu_);
    if (id < 0 || id >= static_cast<int>(servers_.size())) return std::nullopt;
    Member& m = servers_[id];
    if (m.state != MemberState::kAlive || (incarnation != 0 && incarnation != m.incarnation)) return std::nullopt;
    m.state = MemberState::kLost;
    m.awaited = false;
    ChangedLocked();
    event.kind = MembershipEvent::kServerLost;
    event.member = m;
    event.failure = why;
  }
  Publish({event});
  return event.member;
}

void ClusterView::SetWorkerDevice(int id, const std::string& device) {
  absl::MutexLock lock(&mu_);
  if (id >= 0 && id < static_cast<int>(workers_.size())) workers_[id].device = device;
}

std::string ClusterView::WaitingSummary(absl::Time now, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto missing = [](const std::vector<Member>& slots) {
    int n = 0;
    for (const Member& m : slots) n += m.state == MemberState::kVacant || m.state == MemberState::kLost;
    return n;
  };
  const int missing_servers = missing(servers_);
  const int missing_workers = missing(workers_);
  if (missing_servers == 0 && missing_workers == 0) return "";
  auto count = [](int n, const char* one, const char* many) { return absl::StrCat(n, " more ", n == 1 ? one : many); };
  std::vector<std::string> parts;
  if (missing_servers > 0) parts.push_back(count(missing_servers, "server", "servers"));
  if (missing_workers > 0) parts.push_back(count(missing_workers, "worker", "workers"));
  std::string text = absl::StrCat("waiting for ", absl::StrJoin(parts, " and "));
  for (const std::vector<Member>* slots : {&servers_, &workers_}) {
    for (const Member& m : *slots) {
      if (m.state == MemberState::kVacant || m.state == MemberState::kDone) continue;
      const bool lost = m.state == MemberState::kLost || now - m.last_seen > timeout;
      absl::StrAppend(&text, "; ", m.Describe(), lost ? " lost, last heard " : " last heard ",
                      absl::ToInt64Seconds(now - m.last_seen), " s ago");
    }
  }
  return text;
}

void ClusterView::ChangedLocked() {
  ++changes_;
  if (placement_) ++epoch_;  // before placement nobody holds a view to compare with
}

tessera::v1::ShardMap ClusterView::MapLocked() const {
  tessera::v1::ShardMap map = *placement_;
  map.set_epoch(epoch_);
  map.set_rollback_generation(rollback_generation_);
  map.set_rollback_clock(rollback_clock_);
  map.clear_servers();
  for (const Member& s : servers_) {
    if (s.state != MemberState::kAlive) continue;
    auto* info = map.add_servers();
    info->set_id(s.id);
    info->set_address(s.address);
    info->set_fabric_address(s.fabric_address);
    info->set_incarnation(s.incarnation);
    info->set_key_digest(s.key_digest);
    info->set_replication_key(s.replication_key);
  }
  for (const Member& w : workers_) {
    auto* slot = map.add_workers();
    slot->set_id(w.id);
    // A vacant rank is held by nobody: incarnation 0, which servers do not check, so its first process (of a
    // resumed job too) is taken before the next view reaches them.
    slot->set_incarnation(w.state == MemberState::kVacant ? 0 : w.incarnation);
    // Rounds wait for ranks not registered yet (the job starts with all of them) and for workers that are done
    // (they may be finishing a round); a lost one is out.
    slot->set_active(w.state != MemberState::kLost);
    slot->set_joined_clock(w.joined_clock);
    if (w.state != MemberState::kVacant) slot->set_key_digest(w.key_digest);
  }
  return map;
}

std::optional<tessera::v1::ShardMap> ClusterView::Map() const {
  absl::MutexLock lock(&mu_);
  if (!placement_) return std::nullopt;
  return MapLocked();
}

uint64_t ClusterView::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

bool ClusterView::placed() const {
  absl::MutexLock lock(&mu_);
  return placement_.has_value();
}

std::vector<Member> ClusterView::Servers() const {
  absl::MutexLock lock(&mu_);
  return servers_;
}

std::vector<Member> ClusterView::Workers() const {
  absl::MutexLock lock(&mu_);
  return workers_;
}

bool ClusterView::AllServersAlive() const {
  absl::MutexLock lock(&mu_);
  for (const Member& s : servers_) {
    if (s.state != MemberState::kAlive) return false;
  }
  return true;
}

}  // namespace tessera
