#include "server/row_requests.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/model/shard_map.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"
#include "common/model/wire_limits.h"
#include "server/request_checks.h"
#include "common/base/row_batch.h"
#include "absl/synchronization/notification.h"

namespace tessera {

absl::StatusOr<RowRequests::FoundRows> RowRequests::FindRows(uint64_t epoch, int worker, const std::string& table,
                                                            absl::Span<const uint64_t> ids) const {
  if (static_cast<int64_t>(ids.size()) > kMaxRowsPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat(ids.size(), " ids in one request for rows of '",
                                                   table.substr(0, kMaxNameBytes), "'; at most ", kMaxRowsPerRequest));
  }
  absl::ReaderMutexLock lock(&state_.mu);
  TESSERA_RETURN_IF_ERROR(CheckEpochLocked(state_, epoch));
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

void RowRequests::Pull(std::shared_ptr<const tessera::v1::RowPullRequest> request, PullDone done) const {
  const absl::Span<const uint64_t> ids(request->ids().data(), request->ids_size());
  absl::StatusOr<FoundRows> found = FindRows(request->epoch(), request->worker_id(), request->table(), ids);
  if (!found.ok()) return done(found.status());
  // SYNC with backup workers: the rounds before the puller's clock must be applied here first.
  absl::StatusOr<bool> parked = found->config->policy->ParkRowPull(
      request->table(), request->clock(), [this, request, done] { Pull(request, done); });
  if (!parked.ok()) return done(parked.status());
  if (*parked) return;
  const int64_t dim = found->spec->dim;
  // Every float of the buffer is written below; it goes to the wire as it is.
  PulledRows pulled;
  pulled.bytes = ids.size() * dim * sizeof(float);
  std::shared_ptr<PooledBuffer> values = buffers_.Get(std::max<size_t>(pulled.bytes, 1));
  float* out = reinterpret_cast<float*>(values->data());
  for (auto& [slot, positions] : found->slots) {
    absl::MutexLock slot_lock(&slot->mu);
    // A view adopted since FindRows may have moved the slot away (retired, its rows cleared): ask again there.
    if (slot->replication.primary != found->server_id) return done(MovedAway(found->epoch));
    for (int64_t i : positions) slot->ReadLocked(ids[i], absl::MakeSpan(out + i * dim, dim));
  }
  pulled.values = std::move(values);
  done(std::move(pulled));
}

absl::StatusOr<tessera::v1::RowPullResponse> RowRequests::Pull(const tessera::v1::RowPullRequest& request) const {
  absl::Notification answered;
  absl::StatusOr<tessera::v1::RowPullResponse> result;
  Pull(std::make_shared<tessera::v1::RowPullRequest>(request), [&](absl::StatusOr<PulledRows> pulled) {
    if (pulled.ok()) {
      tessera::v1::RowPullResponse response;
      response.set_values(reinterpret_cast<const char*>(pulled->values->data()), pulled->bytes);
      result = std::move(response);
    } else {
      result = pulled.status();
    }
    answered.Notify();
  });
  answered.WaitForNotification();
  return result;
}

absl::StatusOr<RowPush> RowRequests::CheckPush(const tessera::v1::RowPushRequest& request,
                                                std::string_view member_key, const FoundRows& found,
                                                const std::string& what) const {
  const int64_t dim = found.spec->dim;
  TESSERA_RETURN_IF_ERROR(CheckPushStamp(
      *found.roster, found.config->job.cluster().num_workers(),
      PushStamp{request.worker_id(), request.incarnation(), member_key, request.seq(), request.clock(), 0}, what));
  if (request.batch_size() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": batch_size must be > 0, got ", request.batch_size()));
  }
  const float lr_factor = request.has_lr_factor() ? request.lr_factor() : 1.0f;
  if (!(std::isfinite(lr_factor) && lr_factor >= 0 && lr_factor <= kMaxLrFactor)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": learning-rate factor ", lr_factor,
                                                   " must be within 0 .. ", kMaxLrFactor));
  }
  const size_t rows = request.ids_size();
  if (request.grads().size() != rows * dim * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", request.grads().size(), " bytes of gradients for ",
                                                   rows, " rows of ", dim, " values"));
  }
  RowPush push;
  push.spec = found.spec;
  push.worker = request.worker_id();
  push.seq = request.seq();
  push.clock = request.clock();
  push.batch_size = request.batch_size();
  push.lr_factor = lr_factor;
  push.skip = request.skip();
  // Each slot's ids with their gradients, copied once out of the request (whose bytes need not be aligned for
  // floats) and checked finite there, before anything is taken; duplicates summed in an order fixed by their
  // values (a worker sends each id once, ascending, and such a batch is taken as it comes).
  const char* grads = request.grads().data();
  const size_t row_bytes = dim * sizeof(float);
  for (const auto& [slot, positions] : found.slots) {
    RowGradients batch;
    batch.ids.reserve(positions.size());
    batch.grads.resize(positions.size() * dim);
    for (size_t k = 0; k < positions.size(); ++k) {
      batch.ids.push_back(request.ids(static_cast<int>(positions[k])));
      std::memcpy(batch.grads.data() + k * dim, grads + positions[k] * row_bytes, row_bytes);
    }
    if (!AllFinite(batch.grads)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": non-finite gradients; nothing was applied"));
    }
    TESSERA_ASSIGN_OR_RETURN(RowGradients summed, SumDuplicates(std::move(batch), dim));
    push.slots.push_back(SlotRows{slot, std::move(summed)});
  }
  return push;
}

void RowRequests::Push(const tessera::v1::RowPushRequest& request, std::string_view member_key, PushDone done) {
  const absl::Span<const uint64_t> ids(request.ids().data(), request.ids_size());
  absl::StatusOr<FoundRows> found = FindRows(request.epoch(), request.worker_id(), request.table(), ids);
  if (!found.ok()) return done(found.status());
  const std::string what = absl::StrCat("push to rows of '", request.table(), "'");
  absl::StatusOr<RowPush> push = CheckPush(request, member_key, *found, what);
  if (!push.ok()) return done(push.status());
  StoreCounters::Push counted;
  counted.bytes = request.grads().size() + request.ids().size() * sizeof(uint64_t);
  counted.worker = request.worker_id();
  counters_.CountPush(counted);
  // The policy decides when the rows apply: now, or when their round closes.
  RowsTaken taken;
  found->config->policy->AdmitRows(*std::move(push), std::move(done), *found->roster,
                                   ApplierFor(found->server_id, found->epoch), taken);
  Finish(taken);
}

RowApplier RowRequests::ApplierFor(int server_id, uint64_t epoch) {
  return [this, server_id, epoch](const RowUpdate& update) { return Apply(update, server_id, epoch); };
}

namespace {
// Has `slot` applied every push of `update` before (a retry)?
bool AppliedBefore(const RowSlot& slot, const RowUpdate& update) ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot.mu) {
  for (const auto& [worker, seq] : update.pushes) {
    auto seen = slot.last_seq.find(worker);
    if (seen == slot.last_seq.end() || seq > seen->second) return false;
  }
  return !update.pushes.empty();
}
}  // namespace

RowUpdateResult RowRequests::Apply(const RowUpdate& update, int server_id, uint64_t epoch) {
  RowUpdateResult result;
  const RowTableSpec& spec = *update.spec;
  // The memory of the rows it creates is taken first, for the whole update: one that does not fit changes
  // nothing, unless the table evicts (evict_when_full), which makes room slot by slot below, under each slot's
  // lock.
  int64_t fresh = 0;
  for (const SlotRows& s : update.slots) {
    absl::MutexLock slot_lock(&s.slot->mu);
    fresh += s.slot->NewRowsLocked(s.rows.ids);
  }
  int64_t reserved = fresh * spec.RowBytes();
  const bool fits = state_.row_memory.Reserve(reserved);
  const bool evicting = !fits && spec.evict_when_full;
  if (!fits && !evicting) {
    result.status = absl::ResourceExhaustedError(absl::StrCat(
        "push to rows of '", spec.name, "': its ", fresh, " new rows (", reserved,
        " bytes) do not fit this server's row memory (", state_.row_memory.used(), " of ", state_.row_memory.cap(),
        " bytes used; --max_row_memory_mb); nothing was applied. Add servers, or give the table admit_after, "
        "expire_after_steps or evict_when_full"));
    return result;
  }
  if (evicting) reserved = 0;
  result.duplicate = true;
  for (const SlotRows& s : update.slots) {
    RowSlot& slot = *s.slot;
    absl::MutexLock slot_lock(&slot.mu);
    if (slot.replication.primary != server_id) {
      // A view adopted since the push was checked moved the slot away: its rows are asked for again there (the
      // slots applied keep the push; a retry with its seq is a duplicate there).
      result.status = MovedAway(epoch);
      continue;
    }
    if (AppliedBefore(slot, update)) {
      result.held.emplace_back(&slot, slot.version);  // answered once the backups hold it, as the first answer was
      continue;
    }
    result.duplicate = false;
    // Evicting: as many of the slot's least recently updated rows as the update creates in it, unless the budget
    // has room for them now.
    std::vector<uint64_t> evict;
    if (evicting) {
      const int64_t needed = slot.NewRowsLocked(s.rows.ids);
      if (!state_.row_memory.Reserve(needed * spec.RowBytes())) {
        evict = slot.OldestRowsLocked(needed, s.rows.ids);
      } else {
        state_.row_memory.Release(needed * spec.RowBytes());  // the rows charge themselves as created
      }
    }
    RowsApplied applied = slot.ApplyLocked(s.rows.ids, s.rows.grads, update.lr_factor, update.clock, reserved, evict);
    for (const auto& [worker, seq] : update.pushes) slot.last_seq[worker] = seq;
    result.held.emplace_back(&slot, slot.version);
    result.updated += applied.updated;
    result.refused_rows += applied.refused;
    if (!applied.refused_ids.empty()) {
      std::sort(applied.refused_ids.begin(), applied.refused_ids.end());
      result.refused[&slot] = std::move(applied.refused_ids);
    }
  }
  state_.row_memory.Release(reserved);  // what rows created by others meanwhile left unused
  if (update.slots.empty()) result.duplicate = false;
  return result;
}

void RowRequests::Finish(RowsTaken& taken) {
  counters_.CountLate(taken.late);
  for (auto& [done, answer] : taken.now) done(std::move(answer));
  for (auto& [update, result] : taken.applied) {
    if (result.duplicate && update.pushes.size() == 1) counters_.CountDuplicate();
    // Answered once every slot's backups hold the update.
    auto pending = std::make_shared<std::atomic<int>>(1);
    auto held = std::make_shared<absl::Status>(result.status);
    auto held_mu = std::make_shared<absl::Mutex>();
    auto finish = [pending, held, held_mu, waiters = std::make_shared<std::vector<RowWaiter>>(std::move(update.waiters)),
                   result = std::make_shared<RowUpdateResult>(result)](const absl::Status& status) {
      if (!status.ok()) {
        absl::MutexLock lock(held_mu.get());
        held->Update(status);
      }
      if (pending->fetch_sub(1) != 1) return;
      for (RowWaiter& waiter : *waiters) {
        if (held->ok()) {
          waiter.done(AnswerOf(waiter, *result));
        } else {
          waiter.done(*held);
        }
      }
    };
    for (const auto& [slot, version] : result.held) {
      pending->fetch_add(1);
      shipper_.AfterApplied(*slot, version, finish);
    }
    finish(absl::OkStatus());
  }
  for (auto& pull : taken.pulls) pull();
}

}  // namespace tessera
