#include "server/consistency/async_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera {

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
  if (!ApplyUpdateLocked(rule_, chunk, grad, scale, 1.0f, {push.worker_id}, push.clock)) {
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
