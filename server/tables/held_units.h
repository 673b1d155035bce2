// What every kind of table keeps the same way: the units of one kind a server holds, as primary and as backup,
// and those it retired (a unit the view moved away is retired, never freed, so a request that found it keeps a
// valid object); and the units' placements read from the view's chunk list.
#ifndef TESSERA_SERVER_TABLES_HELD_UNITS_H_
#define TESSERA_SERVER_TABLES_HELD_UNITS_H_

#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/cluster.pb.h"
#include "server/tables/table.h"

namespace tessera {

// Not thread-safe: the table's, called under the store's lock.
template <typename U>
class HeldUnits {
 public:
  using Role = Table::Role;
  using Map = std::map<UnitKey, std::unique_ptr<U>>;

  const Map& of(Role role) const { return role == Role::kPrimary ? primary_ : backup_; }

  U* Find(const UnitKey& key, Role role) const {
    auto it = of(role).find(key);
    return it == of(role).end() ? nullptr : it->second.get();
  }
  // In key order.
  std::vector<U*> All(Role role) const {
    std::vector<U*> out;
    for (const auto& [key, unit] : of(role)) out.push_back(unit.get());
    return out;
  }
  U* Add(Role role, std::unique_ptr<U> unit) {
    U* added = unit.get();
    mutable_of(role)[unit->key] = std::move(unit);
    return added;
  }
  // The unit held in the other role, now held in `role`; nullptr when there is none.
  U* ChangeRole(const UnitKey& key, Role role) {
    Map& from = mutable_of(role == Role::kPrimary ? Role::kBackup : Role::kPrimary);
    auto it = from.find(key);
    if (it == from.end()) return nullptr;
    U* unit = it->second.get();
    mutable_of(role)[key] = std::move(it->second);
    from.erase(it);
    return unit;
  }
  // The unit leaves: retired, never freed. Returns it (nullptr when it was not held).
  U* Retire(const UnitKey& key, Role role) {
    auto it = mutable_of(role).find(key);
    if (it == mutable_of(role).end()) return nullptr;
    U* unit = it->second.get();
    retired_.push_back(std::move(it->second));
    mutable_of(role).erase(it);
    return unit;
  }

 private:
  Map& mutable_of(Role role) { return role == Role::kPrimary ? primary_ : backup_; }

  Map primary_;
  Map backup_;
  std::vector<std::unique_ptr<U>> retired_;
};

// The placements of the view's chunks of embedding tables (`embeddings`) or of dense parameters (otherwise);
// UnitPlacement.source is the chunk's index in map.chunks.
inline std::vector<UnitPlacement> ChunkListPlacements(const tessera::v1::ShardMap& map, bool embeddings) {
  std::set<std::string_view> tables;
  for (const auto& p : map.params()) {
    if (p.has_embedding()) tables.insert(p.name());
  }
  std::vector<UnitPlacement> out;
  for (int i = 0; i < map.chunks_size(); ++i) {
    const tessera::v1::ChunkPlacement& chunk = map.chunks(i);
    if ((tables.count(chunk.param()) != 0) != embeddings) continue;
    out.push_back(UnitPlacement{{chunk.param(), chunk.index()},
                                chunk.server_id(),
                                std::vector<int>(chunk.backup_server_ids().begin(), chunk.backup_server_ids().end()),
                                i});
  }
  return out;
}

}  // namespace tessera

#endif  // TESSERA_SERVER_TABLES_HELD_UNITS_H_
