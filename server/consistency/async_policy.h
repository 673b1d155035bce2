// ASYNC and SSP on a server: each gradient is applied on arrival (see policy.h).
#ifndef TESSERA_SERVER_CONSISTENCY_ASYNC_POLICY_H_
#define TESSERA_SERVER_CONSISTENCY_ASYNC_POLICY_H_

#include "server/consistency/policy.h"

namespace tessera {

class AsyncPolicy final : public ConsistencyPolicy {
 public:
  // `delay_compensation`: DC-ASGD's lambda (ConsistencySpec.delay_compensation); 0: off.
  AsyncPolicy(const UpdateRule& rule, bool staleness_aware_lr, float delay_compensation = 0)
      : rule_(rule), staleness_aware_lr_(staleness_aware_lr), delay_compensation_(delay_compensation) {}

  void PrepareChunkLocked(Chunk& chunk, int workers) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // With delay compensation: keeps a copy of the values `worker` was answered (once per version).
  void NoteReadLocked(Chunk& chunk, int worker) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  // With delay compensation and values the pusher read: applies g + lambda * g * g * (values - read) instead of g.
  absl::StatusOr<Admission> AdmitLocked(const ChunkPush& push, const FloatPieces& grad, Chunk& chunk,
                                        const Roster& roster, const std::string& what) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  void AdmitRows(RowPush push, RowAnswer done, const Roster& roster, const RowApplier& apply,
                 RowsTaken& taken) override;

 private:
  const UpdateRule& rule_;
  const bool staleness_aware_lr_;
  const float delay_compensation_;
};

// DC-ASGD's corrected gradient: out[i] = g[i] + lambda * g[i]^2 * (now[i] - read[i]). `out` may not overlap the
// others; all have grad.size() values. Returns the squared L2 norms of g and of the correction.
struct Compensation {
  double grad_sq = 0;
  double correction_sq = 0;
};
Compensation DelayCompensated(const FloatPieces& grad, absl::Span<const float> now, absl::Span<const float> read,
                              float lambda, absl::Span<float> out);

}  // namespace tessera

#endif  // TESSERA_SERVER_CONSISTENCY_ASYNC_POLICY_H_
