#include "scheduler/membership/chunk_moves.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/model/shard_map.h"

namespace tessera {
namespace {

bool Holds(const tessera::v1::ChunkPlacement& c, int server) {
  return c.server_id() == server ||
         std::find(c.backup_server_ids().begin(), c.backup_server_ids().end(), server) != c.backup_server_ids().end();
}

tessera::v1::ChunkPlacement* FindChunk(tessera::v1::ShardMap& placement, const std::string& param, int index) {
  for (auto& c : *placement.mutable_chunks()) {
    if (c.param() == param && c.index() == index) return &c;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::vector<ChunkMove>> DrainMoves(const tessera::v1::ShardMap& map, int server) {
  std::map<int, int64_t> copies;  // bytes of copies on each other alive server
  for (const auto& s : map.servers()) {
    if (s.id() != server) copies[s.id()] = 0;
  }
  for (const auto& c : map.chunks()) {
    for (auto& [id, bytes] : copies) bytes += Holds(c, id) ? c.length() * 4 : 0;
  }
  std::vector<ChunkMove> moves;
  for (const auto& c : map.chunks()) {
    if (!Holds(c, server)) continue;
    auto least = copies.end();
    for (auto it = copies.begin(); it != copies.end(); ++it) {
      if (!Holds(c, it->first) && (least == copies.end() || it->second < least->second)) least = it;
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

std::vector<ChunkMove> ShareMoves(const tessera::v1::ShardMap& map, int server) {
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

absl::Status AddMoveDestinations(const std::vector<ChunkMove>& moves, const std::function<bool(int server)>& alive,
                                 tessera::v1::ShardMap& placement) {
  for (const ChunkMove& m : moves) {
    tessera::v1::ChunkPlacement* c = FindChunk(placement, m.param, m.index);
    if (c == nullptr || !alive(m.to)) {
      return absl::FailedPreconditionError(absl::StrCat("chunk ", m.param, "/", m.index, " cannot move to server ", m.to));
    }
    if (!Holds(*c, m.to)) c->add_backup_server_ids(m.to);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<tessera::v1::ChunkPlacement>> RemoveMoveSources(const std::vector<ChunkMove>& moves,
                                                                           tessera::v1::ShardMap& placement) {
  std::vector<tessera::v1::ChunkPlacement> moved;
  for (const ChunkMove& m : moves) {
    tessera::v1::ChunkPlacement* c = FindChunk(placement, m.param, m.index);
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
  return moved;
}

}  // namespace tessera
