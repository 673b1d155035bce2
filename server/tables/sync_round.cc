#include "server/tables/sync_round.h"

#include <algorithm>

#include "common/base/cpu_clones.h"

namespace tessera {
namespace {

// sum = weight * grad (first) or sum += weight * grad: the round's one pass over each push.
TESSERA_CPU_CLONES void Scaled(float* __restrict sum, const float* __restrict grad, size_t n, float weight,
                               bool first) {
  if (first) {
    for (size_t i = 0; i < n; ++i) sum[i] = weight * grad[i];
  } else {
    for (size_t i = 0; i < n; ++i) sum[i] += weight * grad[i];
  }
}

}  // namespace

void SyncRound::Prepare(size_t length, int workers, bool keep_apart) {
  sum_.assign(length, 0.0f);
  if (keep_apart) {
    kept_.resize(workers);
    kept_batch_.assign(workers, 0);
    kept_terms_.assign(workers, RoundTerms{});
  }
}

void SyncRound::Add(int worker, const FloatPieces& grad, int batch_size, RoundTerms terms) {
  grad.ForEach([&](size_t offset, absl::Span<const float> piece) {
    Scaled(sum_.data() + offset, piece.data(), piece.size(), static_cast<float>(batch_size), workers_.empty());
  });
  if (workers_.empty()) {
    lr_factor_ = terms.lr_factor;
    skip_ = terms.skip;
  } else {
    lr_factor_ = std::min(lr_factor_, terms.lr_factor);
    skip_ = skip_ || terms.skip;
  }
  weight_ += batch_size;
  workers_.push_back(worker);
}

void SyncRound::Keep(int worker, const FloatPieces& grad, int batch_size, RoundTerms terms) {
  std::vector<float>& kept = kept_[worker];
  kept.clear();
  grad.ForEach([&kept](size_t, absl::Span<const float> piece) { kept.insert(kept.end(), piece.begin(), piece.end()); });
  kept_batch_[worker] = batch_size;
  kept_terms_[worker] = terms;
}

int64_t SyncRound::Sum(const std::vector<int>* members) {
  workers_.clear();
  weight_ = 0;
  int64_t left_out = 0;
  for (size_t w = 0; w < kept_batch_.size(); ++w) {
    if (kept_batch_[w] == 0) continue;
    if (members != nullptr && std::binary_search(members->begin(), members->end(), static_cast<int>(w))) {
      Add(static_cast<int>(w), kept_[w], kept_batch_[w], kept_terms_[w]);
    } else {
      ++left_out;
    }
    kept_batch_[w] = 0;
  }
  return left_out;
}

bool SyncRound::Has(int worker) const {
  return std::find(workers_.begin(), workers_.end(), worker) != workers_.end() ||
         (!kept_batch_.empty() && kept_batch_[worker] > 0);
}

bool SyncRound::collecting() const {
  return !workers_.empty() || std::any_of(kept_batch_.begin(), kept_batch_.end(), [](int b) { return b > 0; });
}

void SyncRound::Park(std::shared_ptr<ExchangeWaiter> waiter) {
  waiters_.erase(std::remove_if(waiters_.begin(), waiters_.end(), [](const auto& w) { return w->completed(); }),
                 waiters_.end());
  waiters_.push_back(std::move(waiter));
}

std::vector<std::shared_ptr<ExchangeWaiter>> SyncRound::TakeWaiters() {
  std::vector<std::shared_ptr<ExchangeWaiter>> waiters;
  waiters.swap(waiters_);
  return waiters;
}

std::vector<std::shared_ptr<ExchangeWaiter>> SyncRound::Reset() {
  weight_ = 0;
  skip_ = false;
  workers_.clear();
  std::fill(kept_batch_.begin(), kept_batch_.end(), 0);
  return TakeWaiters();
}

}  // namespace tessera
