// ASYNC and SSP on a server: each gradient is applied on arrival (see policy.h).
#ifndef TESSERA_SERVER_CONSISTENCY_ASYNC_POLICY_H_
#define TESSERA_SERVER_CONSISTENCY_ASYNC_POLICY_H_

#include "server/consistency/policy.h"

namespace tessera {

class AsyncPolicy final : public ConsistencyPolicy {
 public:
  AsyncPolicy(const UpdateRule& rule, bool staleness_aware_lr) : rule_(rule), staleness_aware_lr_(staleness_aware_lr) {}

  absl::StatusOr<Admission> AdmitLocked(const ChunkPush& push, const FloatPieces& grad, Chunk& chunk,
                                        const Roster& roster, const std::string& what) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu);
  void AdmitRows(RowPush push, RowAnswer done, const Roster& roster, const RowApplier& apply,
                 RowsTaken& taken) override;

 private:
  const UpdateRule& rule_;
  const bool staleness_aware_lr_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_CONSISTENCY_ASYNC_POLICY_H_
