#include "worker/data/batch_schedule.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace tessera {

BatchSchedule::BatchSchedule(int64_t examples, int batch_size, int num_workers, int rank, uint64_t seed)
    : examples_(examples),
      batch_size_(batch_size),
      num_workers_(num_workers),
      rank_(rank),
      seed_(seed),
      steps_per_epoch_(std::max<int64_t>(1, examples / (static_cast<int64_t>(batch_size) * num_workers))) {}

std::vector<int64_t> BatchSchedule::Batch(int64_t step) {
  return Slice(step, static_cast<int64_t>(rank_) * batch_size_, batch_size_);
}

std::vector<int64_t> BatchSchedule::Slice(int64_t step, int64_t offset, int count) {
  const int64_t epoch = step / steps_per_epoch_;
  if (epoch != epoch_) {
    order_.resize(examples_);
    std::iota(order_.begin(), order_.end(), 0);
    std::mt19937_64 rng(seed_ * 1000003 + static_cast<uint64_t>(epoch));
    // Fisher-Yates with our own index draw: std::shuffle's use of the engine is implementation-defined.
    for (int64_t i = examples_ - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(order_[i], order_[j]);
    }
    epoch_ = epoch;
  }
  const int64_t global = static_cast<int64_t>(batch_size_) * num_workers_;
  offset = std::clamp<int64_t>(offset, 0, global);
  const int64_t end = std::min<int64_t>(global, offset + std::max(count, 0));
  const int64_t begin = (step % steps_per_epoch_) * global;
  std::vector<int64_t> batch;
  batch.reserve(end - offset);
  for (int64_t i = offset; i < end && begin + i < examples_; ++i) batch.push_back(order_[begin + i]);
  return batch;
}

}  // namespace tessera
