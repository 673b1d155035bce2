#include "server/store_counters.h"

namespace tessera {

void StoreCounters::CountPush(const Push& push) {
  absl::MutexLock lock(&mu_);
  ++pushes_;
  push_bytes_ += static_cast<int64_t>(push.bytes);
  if (push.duplicate) ++duplicate_pushes_;
  if (push.late) ++late_pushes_;
  if (push.compensated) {
    ++compensated_pushes_;
    compensated_grad_sq_ += push.grad_sq;
    compensation_sq_ += push.compensation_sq;
  }
  if (push.staleness >= 0) {
    staleness_.Add(push.staleness);
    if (worker_staleness_.size() <= static_cast<size_t>(push.worker)) worker_staleness_.resize(push.worker + 1);
    worker_staleness_[push.worker].Add(push.staleness);
  }
}

void StoreCounters::CountLate(int64_t gradients) {
  if (gradients == 0) return;
  absl::MutexLock lock(&mu_);
  late_pushes_ += gradients;
}

void StoreCounters::CountDuplicate() {
  absl::MutexLock lock(&mu_);
  ++duplicate_pushes_;
}

void StoreCounters::AddTo(tessera::v1::ServerStats& stats) const {
  absl::MutexLock lock(&mu_);
  stats.set_pushes(pushes_);
  stats.set_duplicate_pushes(duplicate_pushes_);
  stats.set_late_pushes(late_pushes_);
  *stats.mutable_staleness() = staleness_.ToProto();
  for (const StalenessHistogram& h : worker_staleness_) *stats.add_worker_staleness() = h.ToProto();
  stats.set_push_bytes(push_bytes_);
  stats.set_compensated_pushes(compensated_pushes_);
  stats.set_compensated_grad_sq(compensated_grad_sq_);
  stats.set_compensation_sq(compensation_sq_);
}

}  // namespace tessera
