#include "server/tables/chunk.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"
#include "glog/logging.h"

namespace tessera {

bool ApplyUpdateLocked(const UpdateRule& rule, Chunk& chunk, const FloatPieces& grad, float lr_scale,
                       float grad_scale, const std::vector<int>& workers, int64_t clock) {
  const int64_t step = chunk.gradient_updates + 1;
  // The schedule's factor comes from the clock here, not from the caller: a backup replaying the update log
  // (which holds `lr_scale` as given) computes the same one.
  const float rate = lr_scale * rule.RateFactor(clock);
  const bool decay = rule.Decays(chunk.key.first);
  // When the bounds say the result stays far below the largest float, the update is applied in place;
  // otherwise on a kept copy's watch, undone when anything came out non-finite.
  constexpr double kSafe = 1e36;
  const bool safe =
      rule.Bound(chunk.values_bound, chunk.state_bound, grad.MaxAbs(), step, rate, grad_scale, decay) < kSafe;
  thread_local std::vector<float> before;  // per thread, reused
  const size_t n = chunk.values.size();
  if (!safe) {
    before.resize(n + chunk.state.size());
    std::memcpy(before.data(), chunk.values.data(), n * sizeof(float));
    if (!chunk.state.empty()) std::memcpy(before.data() + n, chunk.state.data(), chunk.state.size() * sizeof(float));
  }
  // The result's bounds come from the update's own pass.
  const UpdateRule::Written written =
      rule.ApplyPieces(absl::MakeSpan(chunk.values), grad, absl::MakeSpan(chunk.state), step, rate, grad_scale, decay);
  if (!std::isfinite(written.values) || !std::isfinite(written.state)) {
    CHECK(!safe) << "an update the bounds called safe overflowed";
    std::memcpy(chunk.values.data(), before.data(), n * sizeof(float));
    if (!chunk.state.empty()) std::memcpy(chunk.state.data(), before.data() + n, chunk.state.size() * sizeof(float));
    return false;
  }
  chunk.values_bound = written.values;
  chunk.state_bound = written.state;
  chunk.gradient_updates = step;
  ++chunk.version;
  for (int w : workers) chunk.applied_clocks[w] = std::max(chunk.applied_clocks[w], clock + 1);
  if (!chunk.replication.backups.empty()) LogUpdateLocked(chunk, false, grad, lr_scale, grad_scale, workers, clock);
  return true;
}

void SkipUpdateLocked(Chunk& chunk, const std::vector<int>& workers, int64_t clock) {
  ++chunk.version;
  for (int w : workers) chunk.applied_clocks[w] = std::max(chunk.applied_clocks[w], clock + 1);
  if (chunk.replication.backups.empty() || chunk.replication.log_base < 0) return;
  tessera::v1::ChunkUpdate& u = chunk.replication.log.emplace_back();
  u.set_version(chunk.version);
  u.set_skipped(true);
  for (int w : workers) u.add_workers(w);
  u.set_clock(clock);
  chunk.replication.log_bytes += sizeof(tessera::v1::ChunkUpdate);  // bounded with the rest of the log
}

void LogUpdateLocked(Chunk& chunk, bool assign, const FloatPieces& values, float lr_scale, float grad_scale,
                     const std::vector<int>& workers, int64_t clock) {
  UnitReplication& r = chunk.replication;
  if (r.log_base < 0) return;  // the next hand-over is the whole state anyway
  const size_t bytes = values.size() * sizeof(float);
  if (r.log_bytes + bytes > (chunk.values.size() + chunk.state.size()) * sizeof(float)) {
    // The whole state is smaller than the updates: send that instead.
    r.log.clear();
    r.log_bytes = 0;
    r.log_base = -1;
    return;
  }
  tessera::v1::ChunkUpdate& u = r.log.emplace_back();
  u.set_version(chunk.version);
  u.set_assign(assign);
  std::string& copy = *u.mutable_values();
  copy.reserve(bytes);
  values.ForEach([&copy](size_t, absl::Span<const float> piece) {
    copy.append(reinterpret_cast<const char*>(piece.data()), piece.size() * sizeof(float));
  });
  u.set_lr_scale(lr_scale);
  u.set_grad_scale(grad_scale);
  for (int w : workers) u.add_workers(w);
  u.set_clock(clock);
  r.log_bytes += bytes;
}

void ForgetReadLocked(Chunk& chunk, int worker) {
  if (worker < 0 || worker >= static_cast<int>(chunk.read_version.size())) return;
  chunk.read_version[worker] = -1;
  std::vector<float>().swap(chunk.read_values[worker]);
}

namespace {

// A state from a checkpoint or a primary fits `chunk` and holds finite values only.
absl::Status CheckFits(const tessera::v1::ChunkState& state, const Chunk& chunk, const std::string& what)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu) {
  if (state.values().size() != chunk.values.size() * sizeof(float) ||
      state.optimizer_state().size() != chunk.state.size() * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has another size than the job's"));
  }
  // Nothing non-finite enters the values, a checkpoint's or a primary's included.
  for (const std::string* bytes : {&state.values(), &state.optimizer_state()}) {
    std::vector<float> floats(bytes->size() / sizeof(float));
    if (!floats.empty()) std::memcpy(floats.data(), bytes->data(), floats.size() * sizeof(float));
    TESSERA_RETURN_IF_ERROR(CheckFinite(floats, what));
  }
  return absl::OkStatus();
}

// A backup applies `updates` (from its primary, in order; the first must follow the chunk's version) with `rule`,
// then takes the clocks, counters and sequence table of `after`.
absl::Status ApplyReplicatedLocked(const UpdateRule& rule,
                                   const google::protobuf::RepeatedPtrField<tessera::v1::ChunkUpdate>& updates,
                                   const tessera::v1::ChunkState& after, Chunk& chunk)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu) {
  const size_t n = chunk.values.size();
  for (int i = 0; i < updates.size(); ++i) {
    const tessera::v1::ChunkUpdate& u = updates[i];
    if (u.version() != chunk.version + 1 + i) {
      return absl::FailedPreconditionError(absl::StrCat("update to version ", u.version(), " does not follow version ",
                                                        chunk.version + i, " of the backup"));
    }
    if (u.skipped() ? !u.values().empty() : u.values().size() != n * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat("an update of ", u.values().size(), " bytes for a chunk of ", n,
                                                     " values"));
    }
    for (int w : u.workers()) {
      if (w < 0 || w >= static_cast<int>(chunk.applied_clocks.size())) {
        return absl::InvalidArgumentError(absl::StrCat("an update names worker ", w));
      }
    }
  }
  std::vector<float> values(n);
  for (const tessera::v1::ChunkUpdate& u : updates) {
    chunk.last_round_skipped = u.skipped();
    if (u.skipped()) {
      SkipUpdateLocked(chunk, std::vector<int>(u.workers().begin(), u.workers().end()), u.clock());
      continue;
    }
    std::memcpy(values.data(), u.values().data(), n * sizeof(float));
    if (!std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); })) {
      return absl::InvalidArgumentError("an update with non-finite values");
    }
    if (u.assign()) {
      chunk.values = values;
      ++chunk.version;
      ++chunk.assignments;
      continue;
    }
    const std::vector<int> workers(u.workers().begin(), u.workers().end());
    if (!ApplyUpdateLocked(rule, chunk, values, u.lr_scale(), u.grad_scale(), workers, u.clock())) {
      return absl::FailedPreconditionError("an update the primary applied overflowed on the backup");
    }
  }
  chunk.gradient_updates = after.gradient_updates();
  chunk.assignments = after.assignments();
  for (int w = 0; w < after.applied_clocks_size() && w < static_cast<int>(chunk.applied_clocks.size()); ++w) {
    chunk.applied_clocks[w] = after.applied_clocks(w);
  }
  chunk.last_seq.clear();
  for (const auto& [worker, seq] : after.last_seq()) chunk.last_seq[worker] = seq;
  return absl::OkStatus();
}

// Takes the chunk's state (its sizes checked). Sequence tables are kept only for worker ids with `keep_seq`; the
// open round is dropped, its exchanges moved to `dropped`.
void RestoreChunkLocked(const tessera::v1::ChunkState& state, const std::vector<bool>& keep_seq, Chunk& chunk,
                        std::vector<std::shared_ptr<ExchangeWaiter>>& dropped)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu) {
  std::memcpy(chunk.values.data(), state.values().data(), state.values().size());
  std::memcpy(chunk.state.data(), state.optimizer_state().data(), state.optimizer_state().size());
  chunk.values_bound = std::numeric_limits<float>::infinity();  // not known until the next update measures them
  chunk.state_bound = std::numeric_limits<float>::infinity();
  chunk.version = state.version();
  for (size_t w = 0; w < chunk.read_version.size(); ++w) ForgetReadLocked(chunk, static_cast<int>(w));
  chunk.gradient_updates = state.gradient_updates();
  chunk.assignments = state.assignments();
  chunk.last_round_skipped = false;
  for (int w = 0; w < state.applied_clocks_size() && w < static_cast<int>(chunk.applied_clocks.size()); ++w) {
    chunk.applied_clocks[w] = state.applied_clocks(w);
  }
  chunk.last_seq.clear();
  for (const auto& [worker, seq] : state.last_seq()) {
    if (worker >= 0 && worker < static_cast<int>(keep_seq.size()) && keep_seq[worker]) chunk.last_seq[worker] = seq;
  }
  for (auto& w : chunk.round.Reset()) dropped.push_back(std::move(w));
  for (auto& w : chunk.norm_round.Reset()) dropped.push_back(std::move(w));
  chunk.norm_closed_round = -1;
}

}  // namespace

int64_t ClockVersionLocked(const Chunk& chunk, const Roster& roster) {
  int64_t min = INT64_MAX;
  for (size_t w = 0; w < chunk.applied_clocks.size(); ++w) {
    if (roster.active[w]) min = std::min(min, chunk.applied_clocks[w]);
  }
  if (min != INT64_MAX) return min;
  return chunk.applied_clocks.empty() ? 0 : *std::max_element(chunk.applied_clocks.begin(), chunk.applied_clocks.end());
}

tessera::v1::ChunkState ChunkStateLocked(const Chunk& chunk) {
  tessera::v1::ChunkState state;
  state.set_param(chunk.key.first);
  state.set_index(chunk.key.second);
  state.set_values(std::string(reinterpret_cast<const char*>(chunk.values.data()), chunk.values.size() * sizeof(float)));
  state.set_optimizer_state(
      std::string(reinterpret_cast<const char*>(chunk.state.data()), chunk.state.size() * sizeof(float)));
  state.set_version(chunk.version);
  state.set_gradient_updates(chunk.gradient_updates);
  state.set_assignments(chunk.assignments);
  for (int64_t c : chunk.applied_clocks) state.add_applied_clocks(c);
  for (const auto& [worker, seq] : chunk.last_seq) (*state.mutable_last_seq())[worker] = seq;
  return state;
}

tessera::v1::ChunkState Chunk::StateLocked() const { return ChunkStateLocked(*this); }

tessera::v1::ChunkState Chunk::ReplicaStateLocked(bool with_values) const {
  tessera::v1::ChunkState out;
  if (with_values) {
    out = ChunkStateLocked(*this);
  } else {
    out.set_param(key.first);
    out.set_index(key.second);
    out.set_version(version);
    out.set_gradient_updates(gradient_updates);
    out.set_assignments(assignments);
    for (int64_t c : applied_clocks) out.add_applied_clocks(c);
    for (const auto& [worker, seq] : last_seq) (*out.mutable_last_seq())[worker] = seq;
  }
  for (const auto& [worker, seq] : last_seq) {
    if (round.Has(worker)) out.mutable_last_seq()->erase(worker);
  }
  return out;
}

absl::Status Chunk::TakeReplicaLocked(const UpdateRule& rule, const tessera::v1::ReplicateRequest& request,
                                      int workers) {
  const tessera::v1::ChunkState& taken = request.state();
  if (request.updates_size() > 0) return ApplyReplicatedLocked(rule, request.updates(), taken, *this);
  TESSERA_RETURN_IF_ERROR(CheckFits(taken, *this, absl::StrCat("state of chunk ", key.first, "/", key.second)));
  std::vector<std::shared_ptr<ExchangeWaiter>> none;
  RestoreChunkLocked(taken, std::vector<bool>(workers, true), *this, none);
  return absl::OkStatus();
}

absl::Status Chunk::RestoreLocked(const tessera::v1::ChunkState& saved, const std::vector<bool>& keep_seq,
                                  std::vector<std::shared_ptr<ExchangeWaiter>>& dropped) {
  TESSERA_RETURN_IF_ERROR(CheckFits(saved, *this, absl::StrCat("checkpoint chunk ", key.first, "/", key.second)));
  RestoreChunkLocked(saved, keep_seq, *this, dropped);
  return absl::OkStatus();
}

void Chunk::RenewWorkerLocked(int worker, int64_t joined_clock) {
  last_seq.erase(worker);
  ForgetReadLocked(*this, worker);
  applied_clocks[worker] = std::max(applied_clocks[worker], joined_clock);
}


std::vector<std::shared_ptr<ExchangeWaiter>> Chunk::TakeWaitersLocked() {
  std::vector<std::shared_ptr<ExchangeWaiter>> waiters = round.TakeWaiters();
  for (auto& w : norm_round.TakeWaiters()) waiters.push_back(std::move(w));
  return waiters;
}

}  // namespace tessera
