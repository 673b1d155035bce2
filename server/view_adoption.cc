#include "server/view_adoption.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/tables/sparse_table.h"

namespace tessera {

absl::Status MovedAway(uint64_t epoch) {
  return absl::UnavailableError(absl::StrCat("the chunk was restored from a checkpoint, moved to another server or ",
                                             "demoted (cluster view epoch ", epoch, "); ask again"));
}

absl::StatusOr<bool> ViewAdoption::Run(int server_id) {
  TESSERA_ASSIGN_OR_RETURN(bool newer, Check(server_id));
  if (!newer) return false;
  if (state_.config == nullptr) state_.config = std::make_unique<const JobConfig>(job_);
  IndexCheckpoint();
  TESSERA_RETURN_IF_ERROR(index_error_);
  for (Table* table : state_.tables()) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<UnitPlacement> placements, table->Placements(map_));
    for (const UnitPlacement& placement : placements) {
      if (placement.On(server_id)) TESSERA_RETURN_IF_ERROR(AdoptUnit(*table, placement));
    }
    MoveOut(*table, placements);
  }
  TakePeers();
  TESSERA_RETURN_IF_ERROR(TakeWorkers());
  state_.epoch = map_.epoch();
  state_.view = map_;
  return true;
}

absl::StatusOr<bool> ViewAdoption::Check(int server_id) {
  if (state_.server_id != -1 && state_.server_id != server_id) {
    return absl::FailedPreconditionError(absl::StrCat("this server is server ", state_.server_id,
                                                      "; an assignment for server ", server_id, " came"));
  }
  state_.server_id = server_id;
  if (state_.config != nullptr && !google::protobuf::util::MessageDifferencer::Equals(state_.config->job, job_)) {
    return absl::FailedPreconditionError(absl::StrCat("server ", server_id, " already serves job '",
                                                      state_.config->job.name(), "'; got '", job_.name(), "'"));
  }
  if (map_.epoch() == state_.epoch && map_.epoch() > 0) return false;  // this view again: nothing to do
  if (map_.epoch() <= state_.epoch) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard map epoch ", map_.epoch(), " is not newer than the server's ", state_.epoch));
  }
  return true;
}

void ViewAdoption::IndexCheckpoint() {
  const int workers = job_.cluster().num_workers();
  keep_seq_.assign(workers, false);
  if (restore_ == nullptr) return;
  // The files in order: a delta checkpoint's follow its full one's, and their slots apply over it.
  for (const auto& file : *restore_) {
    for (const auto& c : file.chunks()) {
      const UnitKey key{c.param(), c.index()};
      if (!c.delta()) {
        saved_[key] = &c;
        continue;
      }
      auto full = saved_.find(key);
      absl::StatusOr<tessera::v1::ChunkState> merged =
          full == saved_.end() ? absl::FailedPreconditionError(absl::StrCat(
                                     "delta checkpoint of slot ", c.param(), "/", c.index(), " without its full one"))
                               : ApplyRowDelta(*full->second, c);
      if (!merged.ok()) {
        index_error_.Update(merged.status());
        continue;
      }
      merged_[key] = *std::move(merged);
      saved_[key] = &merged_[key];
    }
  }
  if (restore_->empty()) return;
  const auto& seen = restore_->front().worker_incarnations();
  for (const auto& w : map_.workers()) {
    // Only the very process the checkpoint saw continues its sequence (0 means "not known": a new process).
    if (w.id() >= 0 && w.id() < workers && w.id() < seen.size()) {
      keep_seq_[w.id()] = w.incarnation() != 0 && seen[w.id()] == w.incarnation();
    }
  }
}

absl::Status ViewAdoption::AdoptUnit(Table& table, const UnitPlacement& placement) {
  const Role role = placement.primary == state_.server_id ? Role::kPrimary : Role::kBackup;
  Unit* unit = table.Find(placement.key, role);
  if (unit == nullptr) unit = ChangeRole(table, placement.key, role);
  if (unit == nullptr) {
    TESSERA_RETURN_IF_ERROR(MoveIn(table, placement, role));
    unit = table.Find(placement.key, role);
  } else if (restore_all_) {
    absl::MutexLock unit_lock(&unit->mu);
    TESSERA_RETURN_IF_ERROR(Restore(*unit));
    unit->replication.filled = true;
    unit->replication.lost = false;
  }
  absl::MutexLock unit_lock(&unit->mu);
  if (role == Role::kBackup) {
    FollowPrimary(*unit, placement);
  } else {
    LeadBackups(*unit, placement);
  }
  return absl::OkStatus();
}

Unit* ViewAdoption::ChangeRole(Table& table, const UnitKey& key, Role role) {
  Unit* unit = table.ChangeRole(key, role);
  if (unit == nullptr) return nullptr;
  absl::MutexLock unit_lock(&unit->mu);
  for (auto& w : unit->TakeWaitersLocked()) results_.dropped.push_back(std::move(w));
  if (role == Role::kPrimary && !unit->replication.filled && !restore_all_) {
    // Its primary was lost before it filled this copy (two servers lost within moments): what it holds is not
    // the unit. Requests for it fail loudly rather than train on initial values.
    unit->replication.lost = true;
    LOG(ERROR) << "chunk " << key.first << "/" << key.second << ": made primary of a copy its primary never "
               << "filled; the chunk's state is lost (restore the job from a checkpoint)";
  }
  unit->replication.filled = true;
  return unit;
}

absl::Status ViewAdoption::MoveIn(Table& table, const UnitPlacement& placement, Role role) {
  TESSERA_ASSIGN_OR_RETURN(Unit * unit,
                           table.Create(*state_.config, map_, placement, role, /*from_checkpoint=*/restore_ != nullptr));
  if (restore_ == nullptr) return absl::OkStatus();
  absl::MutexLock unit_lock(&unit->mu);
  return Restore(*unit);
}

absl::Status ViewAdoption::Restore(Unit& unit) {
  auto it = saved_.find(unit.key);
  if (it == saved_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", unit.key.first, "/", unit.key.second, " is in none of the checkpoint's files"));
  }
  if (absl::Status fits = unit.RestoreLocked(*it->second, keep_seq_, results_.dropped); !fits.ok()) {
    return absl::FailedPreconditionError(fits.message());
  }
  return absl::OkStatus();
}

void ViewAdoption::FollowPrimary(Unit& unit, const UnitPlacement& placement) {
  UnitReplication& replication = unit.replication;
  replication.primary = placement.primary;
  replication.backups.clear();
  for (auto& [version, done] : replication.waiting) {
    results_.released.emplace_back(std::move(done), MovedAway(map_.epoch()));
  }
  replication.waiting.clear();
}

void ViewAdoption::LeadBackups(Unit& unit, const UnitPlacement& placement) {
  UnitReplication& replication = unit.replication;
  replication.primary = state_.server_id;
  if (placement.backups != replication.backups || restore_all_) {
    replication.backups = placement.backups;
    ++replication.generation;
    replication.replicated_version = -1;  // new backups (or new state): hand it over whole
    replication.log_base = -1;
    replication.log.clear();
    replication.log_bytes = 0;
  }
  if (replication.backups.empty()) {
    // Nothing to wait for any more (the job is down to one copy).
    for (auto& [version, done] : replication.waiting) results_.released.emplace_back(std::move(done), absl::OkStatus());
    replication.waiting.clear();
  } else if (replication.replicated_version < 0) {
    results_.to_ship.push_back(&unit);
  }
}

void ViewAdoption::MoveOut(Table& table, const std::vector<UnitPlacement>& placements) {
  std::set<UnitKey> here;
  for (const UnitPlacement& placement : placements) {
    if (placement.On(state_.server_id)) here.insert(placement.key);
  }
  for (Role role : {Role::kPrimary, Role::kBackup}) {
    for (Unit* unit : table.Units(role)) {
      if (here.count(unit->key) != 0) continue;
      {
        absl::MutexLock unit_lock(&unit->mu);
        for (auto& w : unit->TakeWaitersLocked()) results_.dropped.push_back(std::move(w));
        UnitReplication& replication = unit->replication;
        for (auto& [version, done] : replication.waiting) {
          results_.released.emplace_back(std::move(done), MovedAway(map_.epoch()));
        }
        replication.waiting.clear();
        replication.backups.clear();
        replication.primary = -1;  // a request that found it before this view sees it left (row requests check)
      }
      // Retired, not freed: a request that found the unit before this view keeps a valid object (what it does
      // there no longer counts).
      table.Retire(unit->key, role);
    }
  }
}

void ViewAdoption::TakePeers() {
  state_.peers.clear();
  for (const auto& server : map_.servers()) {
    state_.peers[server.id()] = Peer{server.address(), server.replication_key(), server.incarnation()};
  }
}

absl::Status ViewAdoption::TakeWorkers() {
  // A map without them (one built by hand) keeps every worker in, unchecked.
  const int workers = job_.cluster().num_workers();
  auto roster = std::make_shared<Roster>();
  roster->active.assign(workers, true);
  roster->incarnation.assign(workers, 0);
  roster->joined_clock.assign(workers, 0);
  roster->key_digest.assign(workers, "");
  for (const auto& w : map_.workers()) {
    if (w.id() < 0 || w.id() >= workers) {
      return absl::InvalidArgumentError(absl::StrCat("cluster view names worker ", w.id(), "; the job has ", workers));
    }
    roster->active[w.id()] = w.active();
    roster->incarnation[w.id()] = w.incarnation();
    roster->joined_clock[w.id()] = w.joined_clock();
    roster->key_digest[w.id()] = w.key_digest();
  }
  for (int w = 0; w < workers && state_.roster != nullptr; ++w) {
    if (roster->incarnation[w] == state_.roster->incarnation[w]) continue;
    // A new process: its sequence starts again.
    for (Table* table : state_.tables()) {
      for (Role role : {Role::kPrimary, Role::kBackup}) {
        for (Unit* unit : table->Units(role)) {
          absl::MutexLock unit_lock(&unit->mu);
          unit->RenewWorkerLocked(w, roster->joined_clock[w]);
        }
      }
    }
  }
  state_.roster = std::move(roster);
  return absl::OkStatus();
}

}  // namespace tessera

