#include "server/consistency/async_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera {

Compensation DelayCompensated(const FloatPieces& grad, absl::Span<const float> now, absl::Span<const float> read,
                              float lambda, absl::Span<float> out) {
  Compensation sums;
  grad.ForEach([&](size_t offset, absl::Span<const float> piece) {
    const float* w = now.data() + offset;
    const float* r = read.data() + offset;
    float* o = out.data() + offset;
    float g_sq = 0, c_sq = 0;  // per piece in float (vectorised), summed in double
    for (size_t i = 0; i < piece.size(); ++i) {
      const float g = piece[i];
      const float c = lambda * g * g * (w[i] - r[i]);
      o[i] = g + c;
      g_sq += g * g;
      c_sq += c * c;
    }
    sums.grad_sq += g_sq;
    sums.correction_sq += c_sq;
  });
  return sums;
}

void AsyncPolicy::PrepareChunkLocked(Chunk& chunk, int workers) const {
  if (delay_compensation_ <= 0) return;
  chunk.read_values.assign(workers, {});
  chunk.read_version.assign(workers, -1);
}

void AsyncPolicy::NoteReadLocked(Chunk& chunk, int worker) const {
  if (delay_compensation_ <= 0 || worker < 0 || worker >= static_cast<int>(chunk.read_version.size())) return;
  if (chunk.read_version[worker] == chunk.version) return;  // the copy holds these values already
  chunk.read_values[worker] = chunk.values;
  chunk.read_version[worker] = chunk.version;
}

absl::StatusOr<Admission> AsyncPolicy::AdmitLocked(const ChunkPush& push, const FloatPieces& grad, Chunk& chunk,
                                                   const Roster& roster, const std::string& what) {
  Admission admission;
  admission.staleness = std::max<int64_t>(0, push.clock - push.read_clock_version);
  if (push.skip) {
    // The worker skipped its step (its gradient scaler found inf or NaN): its clock advances, nothing else.
    int64_t& applied = chunk.applied_clocks[push.worker_id];
    applied = std::max(applied, push.clock + 1);
    return admission;
  }
  const float scale = push.lr_factor *
                      (staleness_aware_lr_ ? 1.0f / static_cast<float>(std::max<int64_t>(1, admission.staleness)) : 1.0f);
  const FloatPieces* applied = &grad;
  FloatPieces compensated;
  const int w = push.worker_id;
  if (delay_compensation_ > 0 && w >= 0 && w < static_cast<int>(chunk.read_version.size()) &&
      chunk.read_version[w] >= 0 && chunk.read_version[w] != chunk.version) {
    // The values moved on since this worker read them: correct the gradient toward where it lands. (Unchanged
    // values need no correction; a worker that read nothing since it joined is applied as sent.)
    thread_local std::vector<float> scratch;
    scratch.resize(grad.size());
    const Compensation sums =
        DelayCompensated(grad, chunk.values, chunk.read_values[w], delay_compensation_, absl::MakeSpan(scratch));
    admission.compensated = true;
    admission.grad_sq = sums.grad_sq;
    admission.compensation_sq = sums.correction_sq;
    compensated = FloatPieces(absl::MakeConstSpan(scratch));
    applied = &compensated;
  }
  if (!ApplyUpdateLocked(rule_, chunk, *applied, scale, 1.0f, {push.worker_id}, push.clock)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the update would make values non-finite (a gradient too "
                                                   "large for the job's learning rate); nothing changed"));
  }
  return admission;
}

void AsyncPolicy::AdmitRows(RowPush push, RowAnswer done, const Roster&, const RowApplier& apply,
                            RowsTaken& taken) {
  RowUpdate update;
  update.spec = push.spec;
  update.lr_factor = push.lr_factor;
  update.clock = push.clock;
  update.skip = push.skip;  // the worker's clock goes on; its rows stay as they are
  update.pushes.emplace_back(push.worker, push.seq);
  update.waiters.push_back(WaiterOf(push, std::move(done)));
  update.slots = std::move(push.slots);
  RowUpdateResult result;
  if (!update.skip) result = apply(update);
  taken.applied.emplace_back(std::move(update), std::move(result));
}

}  // namespace tessera
