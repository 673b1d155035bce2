#include "server/tables/dense_table.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/param_init.h"
#include "server/job_config.h"

namespace tessera {

absl::StatusOr<std::vector<UnitPlacement>> DenseTable::Placements(const tessera::v1::ShardMap& map) const {
  std::set<std::string_view> embeddings;  // the sparse kind's (tables/sparse_table.h)
  for (const auto& p : map.params()) {
    if (p.has_embedding()) embeddings.insert(p.name());
  }
  std::vector<UnitPlacement> out;
  out.reserve(map.chunks_size());
  for (int i = 0; i < map.chunks_size(); ++i) {
    const tessera::v1::ChunkPlacement& chunk = map.chunks(i);
    if (embeddings.count(chunk.param()) != 0) continue;
    out.push_back(UnitPlacement{{chunk.param(), chunk.index()},
                                chunk.server_id(),
                                std::vector<int>(chunk.backup_server_ids().begin(), chunk.backup_server_ids().end()),
                                i});
  }
  return out;
}

std::vector<Unit*> DenseTable::Units(Role role) const {
  std::vector<Unit*> out;
  for (const auto& [key, chunk] : held(role)) out.push_back(chunk.get());
  return out;
}

Chunk* DenseTable::FindChunk(const UnitKey& key, Role role) const {
  auto it = held(role).find(key);
  return it == held(role).end() ? nullptr : it->second.get();
}

std::vector<Chunk*> DenseTable::Chunks(Role role) const {
  std::vector<Chunk*> out;
  for (const auto& [key, chunk] : held(role)) out.push_back(chunk.get());
  return out;
}

std::vector<std::string> DenseTable::PrimaryParams() const {
  std::vector<std::string> names;
  for (const auto& [key, unused] : primary_) {
    if (names.empty() || names.back() != key.first) names.push_back(key.first);
  }
  return names;
}

absl::StatusOr<Unit*> DenseTable::Create(const JobConfig& config, const tessera::v1::ShardMap& map,
                                         const UnitPlacement& placement, Role role, bool from_checkpoint) {
  const tessera::v1::ChunkPlacement& where = map.chunks(placement.source);
  auto spec = std::find_if(map.params().begin(), map.params().end(),
                           [&](const auto& p) { return p.name() == where.param(); });
  if (spec == map.params().end()) {
    return absl::InvalidArgumentError(absl::StrCat("shard map places chunk ", where.param(), "/", where.index(),
                                                   " but declares no such parameter"));
  }
  const int workers = config.job.cluster().num_workers();
  auto chunk = std::make_unique<Chunk>(where.param(), where.index(), where.length(), config.rule.state_slots());
  chunk->module_state = spec->state();
  {
    absl::MutexLock chunk_lock(&chunk->mu);
    chunk->applied_clocks.assign(workers, 0);
    config.policy->PrepareChunkLocked(*chunk, workers);
    chunk->replication.filled = from_checkpoint;  // a backup's copy from a checkpoint is the primary's
    // A new job's backups start as their primaries do (and are filled by them at once); a later backup is filled
    // by its primary.
    if (!from_checkpoint) FillInit(spec->init(), spec->name(), where.offset(), absl::MakeSpan(chunk->values));
  }
  Chunk* created = chunk.get();
  held(role)[placement.key] = std::move(chunk);
  return created;
}

Unit* DenseTable::ChangeRole(const UnitKey& key, Role role) {
  Held& from = held(role == Role::kPrimary ? Role::kBackup : Role::kPrimary);
  auto it = from.find(key);
  if (it == from.end()) return nullptr;
  Chunk* chunk = it->second.get();
  held(role)[key] = std::move(it->second);
  from.erase(it);
  return chunk;
}

void DenseTable::Retire(const UnitKey& key, Role role) {
  auto it = held(role).find(key);
  if (it == held(role).end()) return;
  retired_.push_back(std::move(it->second));
  held(role).erase(it);
}

void DenseTable::AddStats(tessera::v1::ServerStats& stats) const {
  int64_t updates = 0;
  int64_t unfilled = 0;
  for (const auto& [key, chunk] : primary_) {
    absl::MutexLock chunk_lock(&chunk->mu);
    updates += chunk->gradient_updates;
    stats.set_bytes(stats.bytes() + static_cast<int64_t>(chunk->values.size() * sizeof(float)));
    stats.set_optimizer_bytes(stats.optimizer_bytes() + static_cast<int64_t>(chunk->state.size() * sizeof(float)));
    unfilled += !chunk->replication.backups.empty() && chunk->replication.replicated_version < 0;
  }
  stats.set_chunks(stats.chunks() + static_cast<int64_t>(primary_.size()));
  stats.set_unfilled_chunks(stats.unfilled_chunks() + unfilled);
  stats.set_backup_chunks(stats.backup_chunks() + static_cast<int64_t>(backup_.size()));
  stats.set_updates_applied(stats.updates_applied() + updates);
}

}  // namespace tessera
