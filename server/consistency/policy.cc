#include "server/consistency/policy.h"

#include "server/consistency/async_policy.h"
#include "server/consistency/sync_policy.h"

namespace tessera {

std::unique_ptr<ConsistencyPolicy> ConsistencyPolicy::ForJob(const tessera::v1::ConsistencySpec& consistency,
                                                             const UpdateRule& rule) {
  if (consistency.mode() != tessera::v1::ConsistencySpec::SYNC) {
    return std::make_unique<AsyncPolicy>(rule, consistency.staleness_aware_lr(), consistency.delay_compensation());
  }
  if (consistency.backup_workers() > 0) return std::make_unique<BackupSyncPolicy>(rule);
  return std::make_unique<SyncPolicy>(rule);
}

}  // namespace tessera
