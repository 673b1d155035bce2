#include "server/consistency/async_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::StatusOr<Admission> AsyncPolicy::AdmitLocked(const ChunkPush& push, absl::Span<const float> grad, Chunk& chunk,
                                                   const Roster& roster, const std::string& what) {
  Admission admission;
  admission.staleness = std::max<int64_t>(0, push.clock - push.read_clock_version);
  const float scale = staleness_aware_lr_ ? 1.0f / static_cast<float>(std::max<int64_t>(1, admission.staleness)) : 1.0f;
  if (!ApplyUpdateLocked(rule_, chunk, grad, scale, 1.0f, {push.worker_id}, push.clock)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the update would make values non-finite (a gradient too "
                                                   "large for the job's learning rate); nothing changed"));
  }
  return admission;
}

}  // namespace tessera
