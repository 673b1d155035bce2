// A worker's examples of one SYNC round: [offset, offset + count) of the round's global batch, in the order
// the batch schedule gives (worker/data/batch_schedule.h). Decided by the scheduler (scheduler/gate/batch_balancer.h)
// when the job balances the split; count 0 means the default: batch_size examples at rank * batch_size.
#ifndef TESSERA_COMMON_BASE_BATCH_SLICE_H_
#define TESSERA_COMMON_BASE_BATCH_SLICE_H_

#include <cstdint>

namespace tessera {

struct BatchSlice {
  int64_t offset = 0;
  int count = 0;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_BATCH_SLICE_H_
