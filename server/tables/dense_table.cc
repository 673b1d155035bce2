#include "server/tables/dense_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/param_init.h"

namespace tessera {

absl::StatusOr<std::vector<UnitPlacement>> DenseTable::Placements(const tessera::v1::ShardMap& map) const {
  return ChunkListPlacements(map, /*embeddings=*/false);
}

std::vector<Unit*> DenseTable::Units(Role role) const {
  std::vector<Chunk*> chunks = held_.All(role);
  return std::vector<Unit*>(chunks.begin(), chunks.end());
}

std::vector<std::string> DenseTable::PrimaryParams() const {
  std::vector<std::string> names;
  for (const auto& [key, unused] : held_.of(Role::kPrimary)) {
    if (names.empty() || names.back() != key.first) names.push_back(key.first);
  }
  return names;
}

absl::StatusOr<Unit*> DenseTable::Create(const UnitSettings& settings, const tessera::v1::ShardMap& map,
                                         const UnitPlacement& placement, Role role, bool from_checkpoint) {
  const tessera::v1::ChunkPlacement& where = map.chunks(placement.source);
  auto spec = std::find_if(map.params().begin(), map.params().end(),
                           [&](const auto& p) { return p.name() == where.param(); });
  if (spec == map.params().end()) {
    return absl::InvalidArgumentError(absl::StrCat("shard map places chunk ", where.param(), "/", where.index(),
                                                   " but declares no such parameter"));
  }
  const int workers = settings.job_spec().cluster().num_workers();
  auto chunk = std::make_unique<Chunk>(where.param(), where.index(), where.length(), settings.state_slots());
  chunk->module_state = spec->state();
  {
    absl::MutexLock chunk_lock(&chunk->mu);
    chunk->applied_clocks.assign(workers, 0);
    settings.PrepareChunkLocked(*chunk, workers);
    chunk->replication.filled = from_checkpoint;  // a backup's copy from a checkpoint is the primary's
    // A new job's backups start as their primaries do (and are filled by them at once); a later backup is filled
    // by its primary.
    if (!from_checkpoint) FillInit(spec->init(), spec->name(), where.offset(), absl::MakeSpan(chunk->values));
  }
  return held_.Add(role, std::move(chunk));
}

void DenseTable::AddStats(tessera::v1::ServerStats& stats) const {
  int64_t updates = 0;
  int64_t unfilled = 0;
  const auto& primary = held_.of(Role::kPrimary);
  for (const auto& [key, chunk] : primary) {
    absl::MutexLock chunk_lock(&chunk->mu);
    updates += chunk->gradient_updates;
    stats.set_bytes(stats.bytes() + static_cast<int64_t>(chunk->values.size() * sizeof(float)));
    stats.set_optimizer_bytes(stats.optimizer_bytes() + static_cast<int64_t>(chunk->state.size() * sizeof(float)));
    unfilled += !chunk->replication.backups.empty() && chunk->replication.replicated_version < 0;
  }
  stats.set_chunks(stats.chunks() + static_cast<int64_t>(primary.size()));
  stats.set_unfilled_chunks(stats.unfilled_chunks() + unfilled);
  stats.set_backup_chunks(stats.backup_chunks() + static_cast<int64_t>(held_.of(Role::kBackup).size()));
  stats.set_updates_applied(stats.updates_applied() + updates);
}

}  // namespace tessera
