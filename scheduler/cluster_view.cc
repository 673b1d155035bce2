#include "scheduler/cluster_view.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include <algorithm>
#include <map>
#include <set>

#include "common/security.h"
#include "common/shard_map.h"
#include "common/status_macros.h"
#include "common/wire_limits.h"

namespace tessera {

namespace {
// What every registration (a first one, or a member coming back) must hold: a known role, the lengths
// common/wire_limits.h allows, and for a server its address and the key of its control calls.
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
  const char* role = server ? "server" : "worker";
  // A drained server's slot (done) may be taken by a new server.
  auto takeable = [server](const Member& m) {
    return m.state == MemberState::kVacant || m.state == MemberState::kLost || (server && m.state == MemberState::kDone);
  };
  Member* slot = nullptr;
  if (request.has_requested_id()) {
    const int id = request.requested_id();
    if (id < 0 || id >= static_cast<int>(slots.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("register: ", role, " id ", id, " asked for, but the job has ", slots.size(), " (0 to ",
                       static_cast<int>(slots.size()) - 1, ")"));
    }
    if (takeable(slots[id]) || slots[id].state == MemberState::kAlive) slot = &slots[id];
  }
  for (MemberState wanted : {MemberState::kVacant, MemberState::kLost, MemberState::kDone}) {
    for (Member& m : slots) {
      if (slot == nullptr && m.state == wanted && takeable(m)) slot = &m;
    }
  }
  if (slot == nullptr) {
    const char* flag = server ? "--id" : "--rank";
    // The member heard from longest ago among those silent too long or on the registrant's host: most likely
    // the registrant's own earlier self, killed and restarted before it is declared lost.
    const Member* suspect = nullptr;
    for (const Member& m : slots) {
      const bool same_host = !request.hostname().empty() && m.hostname == request.hostname();
      if ((same_host || now - m.last_seen > suspect_after) &&
          (suspect == nullptr || m.last_seen < suspect->last_seen)) {
        suspect = &m;
      }
    }
    if (suspect != nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "all ", slots.size(), " ", role, "s are registered; ", suspect->Describe(), " was last heard ",
          absl::FormatDuration(absl::Trunc(now - suspect->last_seen, absl::Milliseconds(100))),
          " ago: waiting to take its place once it is declared lost (", flag, "=", suspect->id,
          " takes it at once)"));
    }
    const std::string who = server ? request.address() : request.hostname();
    return absl::ResourceExhaustedError(absl::StrCat("the job has all its ", slots.size(), " ", role,
                                                     "s alive and answering; no place for the ", role, " at ", who,
                                                     " (a restarted ", role, " takes its place with ", flag, ")"));
  }
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

absl::StatusOr<ClusterView::Placed> ClusterView::Place(const std::vector<tessera::v1::ParameterSpec>& params,
                                                       int64_t chunk_bytes) {
  absl::MutexLock lock(&mu_);
  tessera::v1::ShardMap map;
  if (placement_) {
    map = MapLocked();  // new parameters go to the servers alive now
    if (map.servers_size() == 0) {
      // A resumed job whose servers have not registered again yet (or all lost): the declaration waits for them.
      return absl::UnavailableError("waiting for servers: none of the job's servers is alive");
    }
  } else {
    std::vector<std::string> missing;
    for (const Member& m : servers_) {
      if (m.state != MemberState::kAlive) {
        missing.push_back(m.incarnation == 0 ? absl::StrCat("server ", m.id)
                                             : absl::StrCat(m.Describe(), " (", MemberStateName(m.state), ")"));
      }
    }
    if (!missing.empty()) {
      return absl::UnavailableError(absl::StrCat("waiting for servers: ", absl::StrJoin(missing, ", ")));
    }
    for (const Member& s : servers_) {
      auto* info = map.add_servers();
      info->set_id(s.id);
      info->set_address(s.address);
      info->set_fabric_address(s.fabric_address);
    }
  }
  const int64_t placed_params = map.params_size();
  if (map.run_id().empty()) map.set_run_id(NewSecret().substr(0, 16));
  if (absl::Status s = PlaceParameters(params, chunk_bytes, map, backups_); !s.ok()) return s;
  Placed placed;
  placed.changed = !placement_ || map.params_size() != placed_params;
  placed.base_changes = changes_;
  if (!placed.changed) {
    placed.map = MapLocked();
    return placed;
  }
  map.clear_servers();  // the view's members are filled in by MapLocked
  map.clear_workers();
  // The view as it would be, under an epoch newer than any handed out before: a server that took an earlier plan
  // that was never committed (another server failed to take it) never mistakes this one for it.
  std::optional<tessera::v1::ShardMap> current = std::move(placement_);
  placement_ = map;
  const uint64_t current_epoch = epoch_;
  epoch_ = std::max(epoch_, planned_epoch_) + 1;
  planned_epoch_ = epoch_;
  placed.map = MapLocked();
  placed.placement = std::move(map);
  placement_ = std::move(current);
  epoch_ = current_epoch;
  return placed;
}

absl::Status ClusterView::Commit(const Placed& placed) {
  absl::MutexLock lock(&mu_);
  if (!placed.changed) return absl::OkStatus();
  if (changes_ != placed.base_changes) {
    return absl::AbortedError("the cluster changed while the servers took the placement; placing again");
  }
  placement_ = placed.placement;
  epoch_ = placed.map.epoch();
  return absl::OkStatus();
}

absl::StatusOr<ChunkMoves> ClusterView::MoveChunksOf(int server) {
  absl::StatusOr<ChunkMoves> moves = MoveChunksOfUnpublished(server);
  if (moves.ok() && (!moves->moved.empty() || !moves->promoted.empty())) {
    std::vector<tessera::v1::ChunkPlacement> chunks = moves->promoted;
    chunks.insert(chunks.end(), moves->moved.begin(), moves->moved.end());
    Publish({ChunksMoved(server, chunks)});
  }
  return moves;
}

MembershipEvent ClusterView::ChunksMoved(int server, const std::vector<tessera::v1::ChunkPlacement>& chunks) const {
  MembershipEvent event;
  event.kind = MembershipEvent::kChunksMoved;
  {
    absl::MutexLock lock(&mu_);
    if (server >= 0 && server < static_cast<int>(servers_.size())) event.member = servers_[server];
  }
  event.chunks = chunks;
  return event;
}

absl::StatusOr<ChunkMoves> ClusterView::MoveChunksOfUnpublished(int server) {
  absl::MutexLock lock(&mu_);
  if (!placement_) return ChunkMoves();
  tessera::v1::ShardMap map = MapLocked();  // the alive servers
  absl::StatusOr<ChunkMoves> moves = MoveChunks(server, map);
  if (!moves.ok()) return moves.status();
  if (backups_ > 0) FillBackups(backups_, map);
  *placement_->mutable_chunks() = map.chunks();
  ChangedLocked();
  return moves;
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

absl::StatusOr<std::vector<tessera::v1::ChunkPlacement>> ClusterView::GiveShareTo(int server) {
  absl::StatusOr<std::vector<tessera::v1::ChunkPlacement>> moved = GiveShareToUnpublished(server);
  if (moved.ok() && !moved->empty()) Publish({ChunksMoved(server, *moved)});
  return moved;
}

absl::StatusOr<std::vector<tessera::v1::ChunkPlacement>> ClusterView::GiveShareToUnpublished(int server) {
  absl::MutexLock lock(&mu_);
  if (!placement_ || backups_ == 0) return std::vector<tessera::v1::ChunkPlacement>();
  tessera::v1::ShardMap map = MapLocked();
  for (const auto& c : map.chunks()) {
    if (std::none_of(map.servers().begin(), map.servers().end(), [&](const auto& s) { return s.id() == c.server_id(); })) {
      return absl::FailedPreconditionError(absl::StrCat("server ", c.server_id(), "'s chunks are not moved yet"));
    }
  }
  // The newcomer (holding nothing, so the least loaded) backs up the chunks that lack backups.
  std::vector<tessera::v1::ChunkPlacement> given = FillBackups(backups_, map);
  *placement_->mutable_chunks() = map.chunks();
  if (!given.empty()) ChangedLocked();
  return given;
}

absl::StatusOr<std::vector<ClusterView::ChunkMove>> ClusterView::DrainMoves(int server) const {
  absl::MutexLock lock(&mu_);
  if (!placement_) return std::vector<ChunkMove>();
  tessera::v1::ShardMap map = MapLocked();
  std::map<int, int64_t> copies;
  for (const auto& s : map.servers()) {
    if (s.id() != server) copies[s.id()] = 0;
  }
  auto holds = [](const tessera::v1::ChunkPlacement& c, int id) {
    return c.server_id() == id ||
           std::find(c.backup_server_ids().begin(), c.backup_server_ids().end(), id) != c.backup_server_ids().end();
  };
  for (const auto& c : map.chunks()) {
    for (auto& [id, bytes] : copies) bytes += holds(c, id) ? c.length() * 4 : 0;
  }
  std::vector<ChunkMove> moves;
  for (const auto& c : map.chunks()) {
    if (!holds(c, server)) continue;
    auto least = copies.end();
    for (auto it = copies.begin(); it != copies.end(); ++it) {
      if (!holds(c, it->first) && (least == copies.end() || it->second < least->second)) least = it;
    }
    if (least == copies.end()) {
      return absl::FailedPreconditionError(absl::StrCat("chunk ", c.param(), "/", c.index(),
                                                        " has no other server to go to: every live server holds it"));
    }
    least->second += c.length() * 4;
    moves.push_back({c.param(), c.index(), server, least->first});
  }
  return moves;
}

std::vector<ClusterView::ChunkMove> ClusterView::ShareMoves(int server) const {
  absl::MutexLock lock(&mu_);
  if (!placement_) return {};
  tessera::v1::ShardMap map = MapLocked();
  std::map<int, int64_t> load = BytesPerServer(map);
  std::vector<ChunkMove> moves;
  std::set<std::pair<std::string, int>> taken;
  while (true) {
    auto most = std::max_element(load.begin(), load.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    const tessera::v1::ChunkPlacement* pick = nullptr;
    for (const auto& c : map.chunks()) {
      if (c.server_id() != most->first || taken.count({c.param(), c.index()}) != 0) continue;
      // The newcomer must not hold another copy of it.
      if (std::find(c.backup_server_ids().begin(), c.backup_server_ids().end(), server) != c.backup_server_ids().end()) {
        continue;
      }
      if (pick == nullptr || c.length() > pick->length()) pick = &c;
    }
    if (pick == nullptr || most->first == server || load[server] + pick->length() * 4 >= most->second) break;
    most->second -= pick->length() * 4;
    load[server] += pick->length() * 4;
    taken.insert({pick->param(), pick->index()});
    moves.push_back({pick->param(), pick->index(), most->first, server});
  }
  return moves;
}

absl::Status ClusterView::BeginMoves(const std::vector<ChunkMove>& moves) {
  {
    absl::MutexLock lock(&mu_);
    if (!placement_) return absl::FailedPreconditionError("nothing is placed yet");
    for (const ChunkMove& m : moves) {
      auto* c = FindChunkLocked(m.param, m.index);
      if (c == nullptr || m.to < 0 || m.to >= num_servers_ || servers_[m.to].state != MemberState::kAlive) {
        return absl::FailedPreconditionError(absl::StrCat("chunk ", m.param, "/", m.index, " cannot move to server ", m.to));
      }
      auto& b = *c->mutable_backup_server_ids();
      if (c->server_id() != m.to && std::find(b.begin(), b.end(), m.to) == b.end()) c->add_backup_server_ids(m.to);
    }
    ChangedLocked();
  }
  return absl::OkStatus();
}

absl::Status ClusterView::FinishMoves(const std::vector<ChunkMove>& moves) {
  std::vector<tessera::v1::ChunkPlacement> moved;
  {
    absl::MutexLock lock(&mu_);
    if (!placement_) return absl::FailedPreconditionError("nothing is placed yet");
    for (const ChunkMove& m : moves) {
      auto* c = FindChunkLocked(m.param, m.index);
      if (c == nullptr) return absl::FailedPreconditionError(absl::StrCat("no chunk ", m.param, "/", m.index));
      auto& b = *c->mutable_backup_server_ids();
      if (c->server_id() == m.from) {
        c->set_server_id(m.to);
        b.erase(std::remove(b.begin(), b.end(), m.to), b.end());
      } else {
        b.erase(std::remove(b.begin(), b.end(), m.from), b.end());
      }
      moved.push_back(*c);
    }
    ChangedLocked();
  }
  if (!moved.empty()) Publish({ChunksMoved(moves.front().to, moved)});
  return absl::OkStatus();
}

std::optional<Member> ClusterView::MarkServerDrained(int server) {
  absl::MutexLock lock(&mu_);
  if (server < 0 || server >= num_servers_ || servers_[server].state != MemberState::kAlive) return std::nullopt;
  servers_[server].state = MemberState::kDone;
  ChangedLocked();
  return servers_[server];
}

tessera::v1::ChunkPlacement* ClusterView::FindChunkLocked(const std::string& param, int index) {
  for (auto& c : *placement_->mutable_chunks()) {
    if (c.param() == param && c.index() == index) return &c;
  }
  return nullptr;
}

uint64_t ClusterView::rollback_generation() const {
  absl::MutexLock lock(&mu_);
  return rollback_generation_;
}

void ClusterView::RollBack(int64_t clock) {
  {
    absl::MutexLock lock(&mu_);
    ++rollback_generation_;
    rollback_clock_ = clock;
    ChangedLocked();
  }
  MembershipEvent event;
  event.kind = MembershipEvent::kRolledBack;
  event.clock = clock;
  Publish({event});
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
