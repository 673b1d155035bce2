// ClusterView's placement half: parameters placed on the servers, chunks moved off a lost server, a
// replacement's share and a drained server's copies moved in two phases, and a SYNC rollback. The membership
// half is in cluster_view.cc; both share the view's lock and epoch (cluster_view.h).
#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/security.h"
#include "common/model/shard_map.h"
#include "common/base/status_macros.h"
#include "scheduler/membership/cluster_view.h"

namespace tessera {

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

}  // namespace tessera
