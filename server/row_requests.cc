// The store's requests for rows of embedding tables (ShardStore::PullRows, PushRows): what the dense path's
// Pull and Push are for chunks, for the hash slots of tables/sparse_table.h.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/shard_map.h"
#include "common/status_macros.h"
#include "common/wire_limits.h"
#include "server/shard_store.h"
#include "common/row_batch.h"

namespace tessera {

absl::StatusOr<ShardStore::FoundRows> ShardStore::FindRows(uint64_t epoch, int worker, const std::string& table,
                                                            absl::Span<const uint64_t> ids) const {
  if (static_cast<int64_t>(ids.size()) > kMaxRowsPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat(ids.size(), " ids in one request for rows of '",
                                                   table.substr(0, kMaxNameBytes), "'; at most ", kMaxRowsPerRequest));
  }
  absl::ReaderMutexLock lock(&state_.mu);
  TESSERA_RETURN_IF_ERROR(CheckEpochLocked(epoch));
  FoundRows found;
  found.spec = state_.sparse.Spec(table);
  if (found.spec == nullptr || state_.config == nullptr) {
    return absl::NotFoundError(absl::StrCat("no embedding table '", table.substr(0, kMaxNameBytes), "' on server ",
                                            state_.server_id));
  }
  found.config = state_.config.get();
  found.roster = state_.roster;
  found.server_id = state_.server_id;
  found.epoch = state_.epoch;
  const int workers = found.config->job.cluster().num_workers();
  if (worker < 0 || worker >= workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker id ", worker, " out of range: the job has ", workers, " workers"));
  }
  std::vector<int64_t> slot_of(found.spec->slots, -1);  // slot -> its place in found.slots
  for (size_t i = 0; i < ids.size(); ++i) {
    const int slot = EmbeddingSlot(ids[i], found.spec->slots);
    if (slot_of[slot] < 0) {
      RowSlot* held = state_.sparse.FindSlot({table, slot});
      if (held == nullptr) {
        return absl::NotFoundError(absl::StrCat("id ", ids[i], " of table '", table, "' is in slot ", slot,
                                                ", which server ", state_.server_id, " is not primary of at epoch ",
                                                state_.epoch));
      }
      slot_of[slot] = static_cast<int64_t>(found.slots.size());
      found.slots.emplace_back(held, std::vector<int64_t>());
    }
    found.slots[slot_of[slot]].second.push_back(static_cast<int64_t>(i));
  }
  for (auto& [slot, positions] : found.slots) {
    absl::MutexLock slot_lock(&slot->mu);
    if (slot->replication.lost) {
      return absl::DataLossError(absl::StrCat("slot ", table, "/", slot->key.second, " on server ", state_.server_id,
                                              " lost its state: its backup here was made primary before its old "
                                              "primary filled it (two servers lost within moments); resume the job "
                                              "from a checkpoint"));
    }
  }
  return found;
}

absl::StatusOr<tessera::v1::RowPullResponse> ShardStore::PullRows(const tessera::v1::RowPullRequest& request) const {
  const absl::Span<const uint64_t> ids(request.ids().data(), request.ids_size());
  TESSERA_ASSIGN_OR_RETURN(FoundRows found, FindRows(request.epoch(), request.worker_id(), request.table(), ids));
  const int64_t dim = found.spec->dim;
  std::string values(ids.size() * dim * sizeof(float), '\0');
  float* out = reinterpret_cast<float*>(values.data());
  for (auto& [slot, positions] : found.slots) {
    absl::MutexLock slot_lock(&slot->mu);
    // A view adopted since FindRows may have moved the slot away (retired, its rows cleared): ask again there.
    if (slot->replication.primary != found.server_id) return MovedAway(found.epoch);
    for (int64_t i : positions) slot->ReadLocked(ids[i], absl::MakeSpan(out + i * dim, dim));
  }
  tessera::v1::RowPullResponse response;
  response.set_values(std::move(values));
  return response;
}

void ShardStore::PushRows(const tessera::v1::RowPushRequest& request, std::string_view member_key, RowPushDone done) {
  const absl::Span<const uint64_t> ids(request.ids().data(), request.ids_size());
  absl::StatusOr<FoundRows> found = FindRows(request.epoch(), request.worker_id(), request.table(), ids);
  if (!found.ok()) return done(found.status());
  const std::string what = absl::StrCat("push to rows of '", request.table(), "'");
  const int64_t dim = found->spec->dim;
  absl::Status checked = CheckPusher(*found->roster, request.worker_id(), request.incarnation(), member_key);
  if (checked.ok() && (request.seq() == 0 || request.seq() > static_cast<uint64_t>(kMaxUpdateCount))) {
    checked = absl::InvalidArgumentError(absl::StrCat(what, ": seq ", request.seq(), " is not within 1 .. ",
                                                      kMaxUpdateCount));
  }
  if (checked.ok() && (request.clock() < 0 || request.clock() > kMaxClock || request.batch_size() <= 0)) {
    checked = absl::InvalidArgumentError(absl::StrCat(what, ": clock ", request.clock(), " must be within 0 .. ",
                                                      kMaxClock, " and batch_size > 0, got ", request.batch_size()));
  }
  const float lr_factor = request.has_lr_factor() ? request.lr_factor() : 1.0f;
  if (checked.ok() && !(std::isfinite(lr_factor) && lr_factor >= 0 && lr_factor <= kMaxLrFactor)) {
    checked = absl::InvalidArgumentError(absl::StrCat(what, ": learning-rate factor ", lr_factor,
                                                      " must be within 0 .. ", kMaxLrFactor));
  }
  if (checked.ok() && request.grads().size() != ids.size() * dim * sizeof(float)) {
    checked = absl::InvalidArgumentError(absl::StrCat(what, ": ", request.grads().size(), " bytes of gradients for ",
                                                      ids.size(), " rows of ", dim, " values"));
  }
  if (!checked.ok()) return done(checked);
  std::vector<float> grads(ids.size() * dim);
  if (!grads.empty()) std::memcpy(grads.data(), request.grads().data(), request.grads().size());
  if (!std::all_of(grads.begin(), grads.end(), [](float g) { return std::isfinite(g); })) {
    return done(absl::InvalidArgumentError(absl::StrCat(what, ": non-finite gradients; nothing was applied")));
  }
  // SYNC: each worker's part of the step's mean gradient.
  const JobConfig& config = *found->config;
  if (config.job.consistency().mode() == tessera::v1::ConsistencySpec::SYNC) {
    const int active = static_cast<int>(
        std::count(found->roster->active.begin(), found->roster->active.end(), true));
    const double round = static_cast<double>(std::max(1, config.job.batch_size())) * std::max(1, active);
    const float weight = static_cast<float>(request.batch_size() / round);
    for (float& g : grads) g *= weight;
  }

  // Each slot's ids with their gradients, duplicates summed in an order fixed by their values.
  struct SlotBatch {
    RowSlot* slot;
    RowGradients rows;
    int64_t version = 0;  // after the push
  };
  std::vector<SlotBatch> batches;
  for (auto& [slot, positions] : found->slots) {
    std::vector<uint64_t> slot_ids;
    std::vector<float> slot_grads;
    slot_ids.reserve(positions.size());
    slot_grads.reserve(positions.size() * dim);
    for (int64_t i : positions) {
      slot_ids.push_back(ids[i]);
      slot_grads.insert(slot_grads.end(), grads.begin() + i * dim, grads.begin() + (i + 1) * dim);
    }
    absl::StatusOr<RowGradients> summed = SumDuplicates(slot_ids, slot_grads, dim);
    if (!summed.ok()) return done(summed.status());
    batches.push_back(SlotBatch{slot, *std::move(summed)});
  }
  // The memory of the rows it creates is taken first, for the whole push: one that does not fit changes nothing,
  // unless the table evicts (evict_when_full), which makes room slot by slot below, under each slot's lock.
  int64_t fresh = 0;
  for (SlotBatch& b : batches) {
    absl::MutexLock slot_lock(&b.slot->mu);
    fresh += b.slot->NewRowsLocked(b.rows.ids);
  }
  int64_t reserved = fresh * found->spec->RowBytes();
  const bool fits = state_.row_memory.Reserve(reserved);
  const bool evicting = !fits && found->spec->evict_when_full;
  if (!fits && !evicting) {
    return done(absl::ResourceExhaustedError(absl::StrCat(
        what, ": its ", fresh, " new rows (", reserved, " bytes) do not fit this server's row memory (",
        state_.row_memory.used(), " of ", state_.row_memory.cap(),
        " bytes used; --max_row_memory_mb); nothing was applied. Add servers, or give the table admit_after, "
        "expire_after_steps or evict_when_full")));
  }
  if (evicting) reserved = 0;
  tessera::v1::RowPushResponse response;
  bool all_duplicate = true;
  absl::Status moved;  // a slot a view adopted since FindRows moved away: its rows are asked for again there
  for (SlotBatch& b : batches) {
    absl::MutexLock slot_lock(&b.slot->mu);
    if (b.slot->replication.primary != found->server_id) {
      moved = MovedAway(found->epoch);
      b.slot = nullptr;
      continue;
    }
    auto seen = b.slot->last_seq.find(request.worker_id());
    if (seen != b.slot->last_seq.end() && request.seq() <= seen->second) {
      b.version = b.slot->version;  // applied before: answered once the backups hold it, as the first answer was
      continue;
    }
    all_duplicate = false;
    // Evicting: as many of the slot's least recently updated rows as the push creates in it, unless the budget
    // has room for them now.
    std::vector<uint64_t> evict;
    if (evicting) {
      const int64_t needed = b.slot->NewRowsLocked(b.rows.ids);
      if (!state_.row_memory.Reserve(needed * found->spec->RowBytes())) {
        evict = b.slot->OldestRowsLocked(needed, b.rows.ids);
      } else {
        state_.row_memory.Release(needed * found->spec->RowBytes());  // the rows charge themselves as created
      }
    }
    RowsApplied applied =
        b.slot->ApplyLocked(b.rows.ids, b.rows.grads, lr_factor, request.clock(), reserved, evict);
    b.slot->last_seq[request.worker_id()] = request.seq();
    b.version = b.slot->version;
    response.set_rows_updated(response.rows_updated() + applied.updated);
    response.set_rows_refused(response.rows_refused() + applied.refused);
  }
  state_.row_memory.Release(reserved);  // what rows created by others meanwhile left unused
  if (!moved.ok()) {
    // The slots applied keep the push (a retry with its seq is a duplicate there); the caller retries the rest.
    return done(moved);
  }
  response.set_duplicate(all_duplicate);
  {
    absl::MutexLock lock(&counters_mu_);
    ++counters_.pushes;
    counters_.push_bytes += static_cast<int64_t>(request.grads().size() + request.ids().size() * sizeof(uint64_t));
    if (all_duplicate) ++counters_.duplicate_pushes;
  }
  // Answered once every slot's backups hold the update.
  auto pending = std::make_shared<std::atomic<int>>(1);
  auto status = std::make_shared<absl::Status>();
  auto status_mu = std::make_shared<absl::Mutex>();
  auto finish = [pending, status, status_mu, done = std::move(done), response](const absl::Status& held) {
    if (!held.ok()) {
      absl::MutexLock lock(status_mu.get());
      status->Update(held);
    }
    if (pending->fetch_sub(1) != 1) return;
    if (status->ok()) {
      done(response);
    } else {
      done(*status);
    }
  };
  for (SlotBatch& b : batches) {
    if (b.slot == nullptr) continue;
    pending->fetch_add(1);
    shipper_.AfterApplied(*b.slot, b.version, finish);
  }
  finish(absl::OkStatus());
}

}  // namespace tessera
