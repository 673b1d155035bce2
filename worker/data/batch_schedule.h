// Which examples each worker trains on at each step.
//
// The cluster walks the training set in global batches of batch_size * num_workers examples, in an order
// reshuffled every epoch from the job's seed; worker r takes the r-th slice of every global batch. The order
// depends only on (seed, global batch size), so a single process with batch_size * num_workers examples per step
// sees, at every step, exactly the union of what the workers see: the basis of the sync-equals-local guarantee.
// A balanced SYNC job (ConsistencySpec.balance) splits each global batch unequally: Slice() takes any part.
#ifndef TESSERA_WORKER_DATA_BATCH_SCHEDULE_H_
#define TESSERA_WORKER_DATA_BATCH_SCHEDULE_H_

#include <cstdint>
#include <vector>

namespace tessera {

// Thread-compatible.
class BatchSchedule {
 public:
  // Requires examples >= batch_size * num_workers.
  BatchSchedule(int64_t examples, int batch_size, int num_workers, int rank, uint64_t seed);

  // Global batches per epoch (the remainder of an epoch is skipped).
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  // Example indices of this worker's batch at `step` (0-based clock).
  std::vector<int64_t> Batch(int64_t step);
  // Example indices [offset, offset + count) of the global batch of `step` (clipped to the global batch).
  std::vector<int64_t> Slice(int64_t step, int64_t offset, int count);
  // Passes over the training set by the cluster after `steps` steps.
  double Epochs(int64_t steps) const { return static_cast<double>(steps) / static_cast<double>(steps_per_epoch_); }

 private:
  const int64_t examples_;
  const int batch_size_;
  const int num_workers_;
  const int rank_;
  const uint64_t seed_;
  const int64_t steps_per_epoch_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_DATA_BATCH_SCHEDULE_H_
