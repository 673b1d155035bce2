#include "server/tables/sparse_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/param_init.h"
#include "common/model/shard_map.h"
#include "common/base/status_macros.h"

namespace tessera {

namespace {

using Kind = RowOptimizerSpec::Kind;

// Bytes of one entry of a slot's index (a row number) and its control byte; of a pending id's entry.
constexpr int64_t kIndexEntryBytes = sizeof(uint32_t) + 1;
constexpr int64_t kPendingEntryBytes = sizeof(std::pair<uint64_t, uint32_t>) + 1;

std::string FloatBytes(const float* data, size_t count) {
  return std::string(reinterpret_cast<const char*>(data), count * sizeof(float));
}

bool AllFinite(absl::Span<const float> values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

}  // namespace

int64_t RowTableSpec::RowBytes() const {
  return stride() * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(uint64_t)) +
         kIndexEntryBytes + (tracks_versions ? 4 : 0) + (counts_steps ? 4 : 0) +
         (tracks_clocks() ? 8 : 0);
}

absl::StatusOr<RowOptimizerSpec> RowOptimizerFromProto(const tessera::v1::RowOptimizerSpec& spec) {
  RowOptimizerSpec out;
  switch (spec.kind()) {
    case tessera::v1::RowOptimizerSpec::SGD: out.kind = Kind::kSgd; break;
    case tessera::v1::RowOptimizerSpec::ADAGRAD: out.kind = Kind::kAdagrad; break;
    case tessera::v1::RowOptimizerSpec::ROWWISE_ADAGRAD: out.kind = Kind::kRowwiseAdagrad; break;
    case tessera::v1::RowOptimizerSpec::FTRL: out.kind = Kind::kFtrl; break;
    case tessera::v1::RowOptimizerSpec::LAZY_ADAM: out.kind = Kind::kLazyAdam; break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("row optimizer: unknown kind ", static_cast<int>(spec.kind())));
  }
  auto or_default = [](float value, float fallback) { return value != 0 ? value : fallback; };
  out.learning_rate = or_default(spec.learning_rate(), 0.01f);
  out.epsilon = or_default(spec.epsilon(), 1e-8f);
  out.initial_accumulator = spec.initial_accumulator();
  out.beta1 = or_default(spec.beta1(), 0.9f);
  out.beta2 = or_default(spec.beta2(), 0.999f);
  out.ftrl_beta = or_default(spec.ftrl_beta(), 1.0f);
  out.l1 = spec.l1();
  out.l2 = spec.l2();
  TESSERA_RETURN_IF_ERROR(RowOptimizer::Validate(out));
  return out;
}

absl::StatusOr<std::shared_ptr<const RowTableSpec>> RowTableFromDeclaration(const tessera::v1::ParameterSpec& param,
                                                                            bool delta_checkpoints) {
  TESSERA_RETURN_IF_ERROR(CheckEmbeddingSpec(param));
  auto spec = std::make_shared<RowTableSpec>();
  spec->name = param.name();
  spec->dim = param.shape(0);
  spec->slots = EmbeddingSlots(param);
  spec->init = param.init();
  TESSERA_ASSIGN_OR_RETURN(spec->optimizer_spec, RowOptimizerFromProto(param.embedding().optimizer()));
  spec->state_floats = RowOptimizer(spec->optimizer_spec).StateFloats(spec->dim);
  spec->admit_after = param.embedding().admit_after();
  spec->expire_after = param.embedding().expire_after_steps();
  spec->evict_when_full = param.embedding().evict_when_full();
  spec->counts_steps = spec->optimizer_spec.kind == Kind::kLazyAdam;
  spec->tracks_versions = delta_checkpoints;
  return std::shared_ptr<const RowTableSpec>(std::move(spec));
}

absl::StatusOr<tessera::v1::ChunkState> ApplyRowDelta(const tessera::v1::ChunkState& full,
                                                      const tessera::v1::ChunkState& delta) {
  const std::string what = absl::StrCat("delta checkpoint of slot ", delta.param(), "/", delta.index());
  if (full.version() != delta.base_version()) {
    return absl::FailedPreconditionError(absl::StrCat(what, " applies over version ", delta.base_version(),
                                                      "; the full checkpoint holds version ", full.version()));
  }
  // Floats per row of values and of state, from whichever side holds rows (both, when both do, must agree).
  struct Layout {
    size_t values = 0, state = 0;
    bool steps = false, clocks = false;
  };
  auto layout_of = [](const tessera::v1::ChunkState& s) -> std::optional<Layout> {
    const size_t n = s.row_ids_size();
    if (n == 0) return std::nullopt;
    return Layout{s.values().size() / sizeof(float) / n, s.optimizer_state().size() / sizeof(float) / n,
                  s.row_steps_size() > 0, s.row_clocks_size() > 0};
  };
  std::optional<Layout> layout = layout_of(delta);
  if (!layout) layout = layout_of(full);
  tessera::v1::ChunkState merged = delta;
  merged.set_delta(false);
  merged.clear_all_row_ids();
  merged.clear_base_version();
  merged.clear_row_ids();
  merged.clear_values();
  merged.clear_optimizer_state();
  merged.clear_row_steps();
  merged.clear_row_clocks();
  if (!layout) {
    if (delta.all_row_ids_size() > 0) {
      return absl::FailedPreconditionError(absl::StrCat(what, " names rows neither checkpoint holds"));
    }
    return merged;
  }
  for (const tessera::v1::ChunkState* s : {&full, &delta}) {
    const size_t n = s->row_ids_size();
    if (s->values().size() != n * layout->values * sizeof(float) ||
        s->optimizer_state().size() != n * layout->state * sizeof(float) ||
        s->row_steps_size() != (layout->steps ? static_cast<int>(n) : 0) ||
        s->row_clocks_size() != (layout->clocks ? static_cast<int>(n) : 0)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": rows of another size than the full checkpoint's"));
    }
  }
  // Row i of `s` (sorted ids) appended to `merged`.
  auto append = [&](const tessera::v1::ChunkState& s, int i) {
    merged.add_row_ids(s.row_ids(i));
    merged.mutable_values()->append(s.values(), i * layout->values * sizeof(float), layout->values * sizeof(float));
    merged.mutable_optimizer_state()->append(s.optimizer_state(), i * layout->state * sizeof(float),
                                             layout->state * sizeof(float));
    if (layout->steps) merged.add_row_steps(s.row_steps(i));
    if (layout->clocks) merged.add_row_clocks(s.row_clocks(i));
  };
  auto find = [](const tessera::v1::ChunkState& s, uint64_t id) {
    auto it = std::lower_bound(s.row_ids().begin(), s.row_ids().end(), id);
    return it != s.row_ids().end() && *it == id ? static_cast<int>(it - s.row_ids().begin()) : -1;
  };
  for (uint64_t id : delta.all_row_ids()) {
    if (const int changed = find(delta, id); changed >= 0) {
      append(delta, changed);
    } else if (const int kept = find(full, id); kept >= 0) {
      append(full, kept);
    } else {
      return absl::FailedPreconditionError(absl::StrCat(what, " holds row ", id, ", which neither checkpoint has"));
    }
  }
  return merged;
}

void FillRowInit(const tessera::v1::InitSpec& init, std::string_view name, uint64_t id, absl::Span<float> out) {
  // Row id's elements are elements [id * dim, (id + 1) * dim) of an endless tensor (wrapping at 2^64).
  FillInit(init, name, static_cast<int64_t>(id * static_cast<uint64_t>(out.size())), out);
}

bool RowMemory::Reserve(int64_t bytes) {
  int64_t used = used_.load();
  do {
    if (cap_ > 0 && used + bytes > cap_) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes));
  return true;
}

RowSlot::RowSlot(std::shared_ptr<const RowTableSpec> table, int index, RowMemory* row_memory)
    : Unit(table->name, index), spec(std::move(table)), memory(row_memory), optimizer_(spec->optimizer_spec) {}

RowSlot::~RowSlot() {
  absl::MutexLock lock(&mu);
  ClearLocked();
}

void RowSlot::ReadLocked(uint64_t id, absl::Span<float> out) const {
  ++rows_pulled;
  if (auto it = index_.find(IdKey{id}); it != index_.end()) {
    const float* row = RowLocked(*it);
    std::copy(row, row + spec->dim, out.begin());
  } else if (spec->admit_after > 1) {
    std::fill(out.begin(), out.end(), 0.0f);  // not admitted (yet)
  } else {
    FillRowInit(spec->init, spec->name, id, out);
  }
}

int64_t RowSlot::NewRowsLocked(absl::Span<const uint64_t> ids) const {
  int64_t fresh = 0;
  for (uint64_t id : ids) {
    if (index_.contains(IdKey{id})) continue;
    if (spec->admit_after > 1) {
      auto it = pending_.find(id);
      if ((it == pending_.end() ? 0 : it->second) + 1 < static_cast<uint32_t>(spec->admit_after)) continue;
    }
    ++fresh;
  }
  return fresh;
}

uint32_t RowSlot::CreateLocked(uint64_t id) {
  uint32_t row;
  if (!free_.empty()) {
    row = free_.back();
    free_.pop_back();
  } else {
    row = next_row_++;
    if (row / kBlockRows >= blocks_.size()) {
      blocks_.push_back(std::make_unique<float[]>(kBlockRows * spec->stride()));
      id_blocks_.push_back(std::make_unique<uint64_t[]>(kBlockRows));
    }
    if (spec->tracks_versions) row_versions_.resize(next_row_);
    if (spec->counts_steps) steps_.resize(next_row_);
    if (spec->tracks_clocks()) clocks_.resize(next_row_);
  }
  float* values = RowLocked(row);
  FillRowInit(spec->init, spec->name, id, absl::MakeSpan(values, spec->dim));
  optimizer_.InitState(absl::MakeSpan(values + spec->dim, spec->state_floats));
  if (spec->counts_steps) steps_[row] = 0;
  if (spec->tracks_clocks()) clocks_[row] = clock;
  if (spec->tracks_versions) row_versions_[row] = static_cast<uint32_t>(version);
  id_blocks_[row / kBlockRows][row % kBlockRows] = id;
  index_.insert(row);
  ++rows_created;
  return row;
}

std::vector<uint64_t> RowSlot::OldestRowsLocked(int64_t count, absl::Span<const uint64_t> keep) const {
  std::vector<std::pair<int64_t, uint64_t>> candidates;  // (newest clock, id)
  candidates.reserve(index_.size());
  for (uint32_t row : index_) {
    const uint64_t id = IdOf(row);
    if (!std::binary_search(keep.begin(), keep.end(), id)) candidates.emplace_back(clocks_[row], id);
  }
  count = std::min<int64_t>(count, static_cast<int64_t>(candidates.size()));
  std::nth_element(candidates.begin(), candidates.begin() + count, candidates.end());
  std::vector<uint64_t> oldest;
  for (int64_t i = 0; i < count; ++i) oldest.push_back(candidates[i].second);
  std::sort(oldest.begin(), oldest.end());
  return oldest;
}

void RowSlot::RemoveLocked(uint32_t row) {
  index_.erase(row);
  free_.push_back(row);
  memory->Release(spec->RowBytes());
}

RowsApplied RowSlot::ApplyLocked(absl::Span<const uint64_t> ids, absl::Span<const float> grads, float lr_scale,
                                 int64_t at_clock, int64_t& reserved, absl::Span<const uint64_t> evict) {
  RowsApplied applied;
  const int64_t dim = spec->dim;
  for (uint64_t id : evict) {
    if (auto it = index_.find(IdKey{id}); it != index_.end()) {
      RemoveLocked(*it);
      ++applied.evicted;
    }
  }
  rows_evicted += applied.evicted;
  const int64_t last = clock;
  staleness.Add(std::max<int64_t>(0, last - at_clock));
  clock = std::max(clock, at_clock);
  // Expiry runs, before the update, when the clock passes a multiple of a quarter of the expiry span: on a
  // primary and its backups alike (they apply the same updates in the same order).
  if (spec->expire_after > 0) {
    const int64_t period = std::max<int64_t>(1, spec->expire_after / 4);
    if (clock / period != last / period) applied.expired = ExpireLocked(clock);
  }
  std::vector<float> before(spec->stride());
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t id = ids[i];
    auto it = index_.find(IdKey{id});
    uint32_t row;
    if (it != index_.end()) {
      row = *it;
    } else {
      if (spec->admit_after > 1) {
        uint32_t& seen = pending_[id];
        if (++seen < static_cast<uint32_t>(spec->admit_after)) {
          ++applied.refused;
          applied.refused_ids.push_back(id);
          continue;
        }
        pending_.erase(id);
      }
      // Created rows are paid for by the caller's reservation; beyond it (a backup taking its primary's rows, a
      // restore) they are charged whatever the cap.
      if (reserved >= spec->RowBytes()) {
        reserved -= spec->RowBytes();
      } else {
        memory->Charge(spec->RowBytes());
      }
      row = CreateLocked(id);
      ++applied.created;
    }
    float* values = RowLocked(row);
    std::copy(values, values + spec->stride(), before.begin());
    const int64_t step = spec->counts_steps ? static_cast<int64_t>(steps_[row]) + 1 : 1;
    optimizer_.Apply(absl::MakeSpan(values, dim), absl::MakeSpan(values + dim, spec->state_floats),
                     grads.subspan(i * dim, dim), step, lr_scale);
    if (!AllFinite(absl::MakeConstSpan(values, spec->stride()))) {
      // A finite gradient can still overflow a row: the update is undone, the row stays as it was.
      std::copy(before.begin(), before.end(), values);
      ++applied.refused;
      applied.refused_ids.push_back(id);
      continue;
    }
    if (spec->counts_steps && steps_[row] < UINT32_MAX) ++steps_[row];
    if (spec->tracks_clocks()) clocks_[row] = at_clock;
    if (spec->tracks_versions) row_versions_[row] = static_cast<uint32_t>(version + 1);  // this update's
    ++applied.updated;
  }
  ++version;
  if (!replication.backups.empty()) LogLocked(ids, grads, lr_scale, at_clock, evict);
  rows_updated += applied.updated;
  admission_refusals += applied.refused;
  return applied;
}

int64_t RowSlot::ExpireLocked(int64_t now) {
  std::vector<uint32_t> gone;
  for (uint32_t row : index_) {
    if (clocks_[row] + spec->expire_after < now) gone.push_back(row);
  }
  for (uint32_t row : gone) RemoveLocked(row);
  rows_expired += static_cast<int64_t>(gone.size());
  return static_cast<int64_t>(gone.size());
}

void RowSlot::ClearLocked() {
  memory->Release(static_cast<int64_t>(index_.size()) * spec->RowBytes());
  index_.clear();
  blocks_.clear();
  id_blocks_.clear();
  row_versions_.clear();
  steps_.clear();
  clocks_.clear();
  free_.clear();
  pending_.clear();
  next_row_ = 0;
}

int64_t RowSlot::MemoryBytesLocked() const {
  return static_cast<int64_t>(blocks_.size()) * kBlockRows *
             (spec->stride() * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(uint64_t))) +
         static_cast<int64_t>(index_.capacity()) * kIndexEntryBytes +
         static_cast<int64_t>(pending_.capacity()) * kPendingEntryBytes +
         static_cast<int64_t>(steps_.capacity() * sizeof(uint32_t) + clocks_.capacity() * sizeof(int64_t) +
                              row_versions_.capacity() * sizeof(uint32_t) +
                              free_.capacity() * sizeof(uint32_t));
}

void RowSlot::LogLocked(absl::Span<const uint64_t> ids, absl::Span<const float> grads, float lr_scale,
                        int64_t at_clock, absl::Span<const uint64_t> evicted) {
  UnitReplication& r = replication;
  if (r.log_base < 0) return;  // the next hand-over is the whole state anyway
  const size_t bytes = grads.size() * sizeof(float) + ids.size() * sizeof(uint64_t);
  if (r.log_bytes + bytes > static_cast<size_t>(rows() * spec->stride()) * sizeof(float) + 4096) {
    // The whole state is smaller than the updates: send that instead.
    r.log.clear();
    r.log_bytes = 0;
    r.log_base = -1;
    return;
  }
  tessera::v1::ChunkUpdate& u = r.log.emplace_back();
  u.set_version(version);
  u.set_values(FloatBytes(grads.data(), grads.size()));
  u.mutable_row_ids()->Add(ids.begin(), ids.end());
  u.mutable_evicted_ids()->Add(evicted.begin(), evicted.end());
  u.set_lr_scale(lr_scale);
  u.set_clock(at_clock);
  r.log_bytes += bytes;
}

tessera::v1::ChunkState RowSlot::StateLocked() const { return RowsStateLocked(-1); }

tessera::v1::ChunkState RowSlot::DeltaStateLocked(int64_t base_version) const { return RowsStateLocked(base_version); }

tessera::v1::ChunkState RowSlot::RowsStateLocked(int64_t base_version) const {
  tessera::v1::ChunkState state = ReplicaStateLocked(/*values=*/false);
  std::vector<std::pair<uint64_t, uint32_t>> rows;
  rows.reserve(index_.size());
  for (uint32_t row : index_) rows.emplace_back(IdOf(row), row);
  std::sort(rows.begin(), rows.end());
  if (base_version >= 0 && spec->tracks_versions) {  // (a table without versions writes its whole state)
    // A delta: every id, and the rows changed since `base_version` (a row's version is the slot's version after its
    // last change, kept in 32 bits: the rows changed since are those within (base, version] modulo 2^32).
    state.set_delta(true);
    state.set_base_version(base_version);
    for (const auto& [id, row] : rows) state.add_all_row_ids(id);
    const uint32_t base = static_cast<uint32_t>(base_version);
    const uint32_t span = static_cast<uint32_t>(version - base_version);
    size_t kept = 0;
    for (const auto& r : rows) {
      const uint32_t since = row_versions_[r.second] - base;
      if (since != 0 && since <= span) rows[kept++] = r;
    }
    rows.resize(kept);
  }
  std::string values, optimizer_state;
  values.reserve(rows.size() * spec->dim * sizeof(float));
  optimizer_state.reserve(rows.size() * spec->state_floats * sizeof(float));
  for (const auto& [id, row] : rows) {
    const float* data = RowLocked(row);
    state.add_row_ids(id);
    values.append(FloatBytes(data, spec->dim));
    optimizer_state.append(FloatBytes(data + spec->dim, spec->state_floats));
    if (spec->counts_steps) state.add_row_steps(steps_[row]);
    if (spec->tracks_clocks()) state.add_row_clocks(clocks_[row]);
  }
  state.set_values(std::move(values));
  state.set_optimizer_state(std::move(optimizer_state));
  std::vector<std::pair<uint64_t, uint32_t>> pending(pending_.begin(), pending_.end());
  std::sort(pending.begin(), pending.end());
  for (const auto& [id, touches] : pending) {
    state.add_pending_ids(id);
    state.add_pending_touches(touches);
  }
  return state;
}

tessera::v1::ChunkState RowSlot::ReplicaStateLocked(bool values) const {
  if (values) return StateLocked();
  tessera::v1::ChunkState state;
  state.set_param(key.first);
  state.set_index(key.second);
  state.set_version(version);
  state.set_slot_clock(clock);
  for (const auto& [worker, seq] : last_seq) (*state.mutable_last_seq())[worker] = seq;
  return state;
}

absl::Status RowSlot::TakeRowsLocked(const tessera::v1::ChunkState& state, const std::string& what) {
  const int64_t n = state.row_ids_size();
  const int64_t dim = spec->dim;
  if (state.values().size() != static_cast<size_t>(n * dim) * sizeof(float) ||
      state.optimizer_state().size() != static_cast<size_t>(n * spec->state_floats) * sizeof(float) ||
      state.row_steps_size() != (spec->counts_steps ? n : 0) ||
      state.row_clocks_size() != (spec->tracks_clocks() ? n : 0) ||
      state.pending_ids_size() != state.pending_touches_size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", n, " rows whose values, state or bookkeeping have "
                                                   "another size than the table's"));
  }
  for (int64_t i = 0; i < n; ++i) {
    if ((i > 0 && state.row_ids(i) <= state.row_ids(i - 1)) || EmbeddingSlot(state.row_ids(i), spec->slots) != key.second) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": row ids must ascend, each in this slot"));
    }
  }
  std::vector<float> values(n * dim), opt(n * spec->state_floats);
  if (!values.empty()) std::memcpy(values.data(), state.values().data(), state.values().size());
  if (!opt.empty()) std::memcpy(opt.data(), state.optimizer_state().data(), state.optimizer_state().size());
  if (!AllFinite(values) || !AllFinite(opt)) return absl::InvalidArgumentError(absl::StrCat(what, ": non-finite rows"));
  ClearLocked();
  memory->Charge(n * spec->RowBytes());
  const int64_t saved_clock = clock;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t row = CreateLocked(state.row_ids(i));
    float* data = RowLocked(row);
    std::copy(values.begin() + i * dim, values.begin() + (i + 1) * dim, data);
    std::copy(opt.begin() + i * spec->state_floats, opt.begin() + (i + 1) * spec->state_floats, data + dim);
    if (spec->counts_steps) steps_[row] = state.row_steps(i);
    if (spec->tracks_clocks()) clocks_[row] = state.row_clocks(i);
    if (spec->tracks_versions) row_versions_[row] = static_cast<uint32_t>(state.version());  // unchanged since
  }
  rows_created -= n;  // taken, not created
  clock = saved_clock;
  for (int i = 0; i < state.pending_ids_size(); ++i) pending_[state.pending_ids(i)] = state.pending_touches(i);
  return absl::OkStatus();
}

absl::Status RowSlot::TakeReplicaLocked(const UpdateRule&, const tessera::v1::ReplicateRequest& request, int) {
  const tessera::v1::ChunkState& after = request.state();
  const std::string what = absl::StrCat("state of slot ", key.first, "/", key.second);
  if (request.updates_size() == 0) {
    TESSERA_RETURN_IF_ERROR(TakeRowsLocked(after, what));
  } else {
    for (int i = 0; i < request.updates_size(); ++i) {
      const tessera::v1::ChunkUpdate& u = request.updates(i);
      if (u.version() != version + 1 + i) {
        return absl::FailedPreconditionError(absl::StrCat("update to version ", u.version(),
                                                          " does not follow version ", version + i, " of the backup"));
      }
      if (u.values().size() != static_cast<size_t>(u.row_ids_size() * spec->dim) * sizeof(float) ||
          !std::all_of(u.row_ids().begin(), u.row_ids().end(),
                       [&](uint64_t id) { return EmbeddingSlot(id, spec->slots) == key.second; })) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": an update of ", u.values().size(), " bytes for ",
                                                       u.row_ids_size(), " rows, or of rows of another slot"));
      }
    }
    for (const tessera::v1::ChunkUpdate& u : request.updates()) {
      std::vector<float> grads(u.values().size() / sizeof(float));
      if (!grads.empty()) std::memcpy(grads.data(), u.values().data(), u.values().size());
      if (!AllFinite(grads)) return absl::InvalidArgumentError(absl::StrCat(what, ": an update with non-finite values"));
      int64_t none = 0;
      ApplyLocked(absl::MakeConstSpan(u.row_ids().data(), u.row_ids_size()), grads, u.lr_scale(), u.clock(), none,
                  absl::MakeConstSpan(u.evicted_ids().data(), u.evicted_ids_size()));
    }
  }
  version = after.version();
  clock = after.slot_clock();
  last_seq.clear();
  for (const auto& [worker, seq] : after.last_seq()) last_seq[worker] = seq;
  return absl::OkStatus();
}

absl::Status RowSlot::RestoreLocked(const tessera::v1::ChunkState& state, const std::vector<bool>& keep_seq,
                                    std::vector<std::shared_ptr<ExchangeWaiter>>&) {
  TESSERA_RETURN_IF_ERROR(TakeRowsLocked(state, absl::StrCat("checkpoint slot ", key.first, "/", key.second)));
  version = state.version();
  clock = state.slot_clock();
  last_seq.clear();
  for (const auto& [worker, seq] : state.last_seq()) {
    if (worker >= 0 && worker < static_cast<int>(keep_seq.size()) && keep_seq[worker]) last_seq[worker] = seq;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<UnitPlacement>> SparseTable::Placements(const tessera::v1::ShardMap& map) const {
  return ChunkListPlacements(map, /*embeddings=*/true);
}

std::vector<Unit*> SparseTable::Units(Role role) const {
  std::vector<RowSlot*> slots = held_.All(role);
  return std::vector<Unit*>(slots.begin(), slots.end());
}

const RowTableSpec* SparseTable::Spec(const std::string& name) const {
  auto it = specs_.find(name);
  return it == specs_.end() ? nullptr : it->second.get();
}

absl::StatusOr<Unit*> SparseTable::Create(const UnitSettings& settings, const tessera::v1::ShardMap& map,
                                          const UnitPlacement& placement, Role role, bool from_checkpoint) {
  std::shared_ptr<const RowTableSpec>& spec = specs_[placement.key.first];
  if (spec == nullptr) {
    auto declared = std::find_if(map.params().begin(), map.params().end(),
                                 [&](const auto& p) { return p.name() == placement.key.first; });
    if (declared == map.params().end()) {
      specs_.erase(placement.key.first);
      return absl::InvalidArgumentError(absl::StrCat("shard map places slot ", placement.key.first, "/",
                                                     placement.key.second, " but declares no such table"));
    }
    absl::StatusOr<std::shared_ptr<const RowTableSpec>> made =
        RowTableFromDeclaration(*declared, settings.job_spec().checkpoint().full_every() > 1);
    if (!made.ok()) {
      specs_.erase(placement.key.first);
      return made.status();
    }
    spec = *std::move(made);
  }
  auto slot = std::make_unique<RowSlot>(spec, placement.key.second, memory_);
  {
    absl::MutexLock lock(&slot->mu);
    slot->replication.filled = from_checkpoint;  // as a dense chunk's: a checkpoint's copy is the primary's
  }
  return held_.Add(role, std::move(slot));
}

void SparseTable::Retire(const UnitKey& key, Role role) {
  RowSlot* slot = held_.Retire(key, role);
  if (slot == nullptr) return;
  // Its rows live on where the view placed the slot; here they would only take memory.
  absl::MutexLock lock(&slot->mu);
  slot->ClearLocked();
}

void SparseTable::AddStats(tessera::v1::ServerStats& stats) const {
  std::map<std::string, tessera::v1::TableStats> tables;
  int64_t unfilled = 0;
  for (const auto& [key, slot] : held_.of(Role::kPrimary)) {
    tessera::v1::TableStats& t = tables[key.first];
    t.set_table(key.first);
    absl::MutexLock lock(&slot->mu);
    t.set_slots(t.slots() + 1);
    t.set_rows(t.rows() + slot->rows());
    t.set_bytes(t.bytes() + slot->rows() * slot->spec->stride() * static_cast<int64_t>(sizeof(float)));
    t.set_memory_bytes(t.memory_bytes() + slot->MemoryBytesLocked());
    t.set_rows_pulled(t.rows_pulled() + slot->rows_pulled);
    t.set_rows_updated(t.rows_updated() + slot->rows_updated);
    t.set_rows_created(t.rows_created() + slot->rows_created);
    t.set_rows_expired(t.rows_expired() + slot->rows_expired);
    t.set_rows_evicted(t.rows_evicted() + slot->rows_evicted);
    t.set_admission_refusals(t.admission_refusals() + slot->admission_refusals);
    t.set_pending_ids(t.pending_ids() + slot->pending());
    StalenessHistogram merged;
    merged.Merge(t.staleness());
    merged.Merge(slot->staleness.ToProto());
    *t.mutable_staleness() = merged.ToProto();
    unfilled += !slot->replication.backups.empty() && slot->replication.replicated_version < 0;
  }
  for (auto& [name, t] : tables) *stats.add_tables() = std::move(t);
  stats.set_unfilled_chunks(stats.unfilled_chunks() + unfilled);
  stats.set_backup_chunks(stats.backup_chunks() + static_cast<int64_t>(held_.of(Role::kBackup).size()));
}

}  // namespace tessera
