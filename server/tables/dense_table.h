// The dense kind of table: each dense parameter of the job cut into chunks (tables/chunk.h), the chunks the view
// places on this server held as primary or as backup.
#ifndef TESSERA_SERVER_TABLES_DENSE_TABLE_H_
#define TESSERA_SERVER_TABLES_DENSE_TABLE_H_

#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "server/tables/chunk.h"
#include "server/tables/held_units.h"
#include "server/tables/table.h"

namespace tessera {

class DenseTable final : public Table {
 public:
  std::string_view kind() const override { return "dense"; }
  absl::StatusOr<std::vector<UnitPlacement>> Placements(const tessera::v1::ShardMap& map) const override;
  Unit* Find(const UnitKey& key, Role role) const override { return held_.Find(key, role); }
  std::vector<Unit*> Units(Role role) const override;
  absl::StatusOr<Unit*> Create(const UnitSettings& settings, const tessera::v1::ShardMap& map,
                               const UnitPlacement& placement, Role role, bool from_checkpoint) override;
  Unit* ChangeRole(const UnitKey& key, Role role) override { return held_.ChangeRole(key, role); }
  void Retire(const UnitKey& key, Role role) override { held_.Retire(key, role); }
  void AddStats(tessera::v1::ServerStats& stats) const override;

  // The chunk held in `role`, or nullptr.
  Chunk* FindChunk(const UnitKey& key, Role role = Role::kPrimary) const { return held_.Find(key, role); }
  // The chunks held in `role`, in key order.
  std::vector<Chunk*> Chunks(Role role = Role::kPrimary) const { return held_.All(role); }
  // The names of the parameters this server is primary of a chunk of (for errors).
  std::vector<std::string> PrimaryParams() const;

 private:
  HeldUnits<Chunk> held_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_TABLES_DENSE_TABLE_H_
