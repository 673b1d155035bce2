#include "scheduler/membership/cluster_view.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/shard_map.h"
#include "common/model/wire_limits.h"
#include "common/rpc/security.h"
#include "scheduler/membership/registration_rules.h"

namespace tessera {

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
  return tessera::WaitingSummary(servers_, workers_, now, timeout);
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

// Placement: parameters placed on the servers, chunks moved off a lost server, a replacement's share and a
// drain's moves (planned and applied by chunk_moves.h), a SYNC rollback.

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

absl::StatusOr<std::vector<ChunkMove>> ClusterView::DrainMoves(int server) const {
  absl::MutexLock lock(&mu_);
  if (!placement_) return std::vector<ChunkMove>();
  return tessera::DrainMoves(MapLocked(), server);
}

std::vector<ChunkMove> ClusterView::ShareMoves(int server) const {
  absl::MutexLock lock(&mu_);
  if (!placement_) return {};
  return tessera::ShareMoves(MapLocked(), server);
}

absl::Status ClusterView::BeginMoves(const std::vector<ChunkMove>& moves) {
  absl::MutexLock lock(&mu_);
  if (!placement_) return absl::FailedPreconditionError("nothing is placed yet");
  tessera::v1::ShardMap placement = *placement_;  // all the moves or none
  auto alive = [this](int s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return s >= 0 && s < num_servers_ && servers_[s].state == MemberState::kAlive;
  };
  TESSERA_RETURN_IF_ERROR(AddMoveDestinations(moves, alive, placement));
  *placement_ = std::move(placement);
  ChangedLocked();
  return absl::OkStatus();
}

absl::Status ClusterView::FinishMoves(const std::vector<ChunkMove>& moves) {
  std::vector<tessera::v1::ChunkPlacement> moved;
  {
    absl::MutexLock lock(&mu_);
    if (!placement_) return absl::FailedPreconditionError("nothing is placed yet");
    tessera::v1::ShardMap placement = *placement_;
    TESSERA_ASSIGN_OR_RETURN(moved, RemoveMoveSources(moves, placement));
    *placement_ = std::move(placement);
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

}  // namespace tessera
