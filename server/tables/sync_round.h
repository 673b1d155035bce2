// The SYNC round a chunk is collecting: the batch-size-weighted sum of its workers' gradients (or, with backup
// workers, each worker's gradient kept apart until the scheduler names the round's members), and the
// exchanges waiting for the round to close. Holds no lock of its own: it lives in a Chunk, under the chunk's.
#ifndef TESSERA_SERVER_TABLES_SYNC_ROUND_H_
#define TESSERA_SERVER_TABLES_SYNC_ROUND_H_

#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "common/base/float_pieces.h"
#include "server/tables/exchange_waiter.h"

namespace tessera {

// What a worker's push says of its round besides the gradient (PushRequest.lr_factor and skip).
struct RoundTerms {
  float lr_factor = 1.0f;
  bool skip = false;
};

class SyncRound {
 public:
  // Sizes the round for chunks of `length` values; `keep_apart` (backup workers) keeps one gradient per worker
  // of `workers` until Sum. Allocates nothing until called (ASYNC and SSP chunks never do).
  void Prepare(size_t length, int workers, bool keep_apart);

  // Adds `batch_size` * `grad` of `worker` to the round's sum (the first gradient starts it, so nothing needs
  // clearing between rounds).
  void Add(int worker, const FloatPieces& grad, int batch_size, RoundTerms terms = {});
  // Backup workers: keeps `worker`'s gradient apart until Sum.
  void Keep(int worker, const FloatPieces& grad, int batch_size, RoundTerms terms = {});
  // Backup workers: sums the kept gradients of `members` (ascending ids) as Add would and forgets every kept
  // one; returns how many of them were left out (not members).
  int64_t Sum(const std::vector<int>* members);

  // Has `worker` contributed (added or kept) to the round?
  bool Has(int worker) const;
  // Has anyone?
  bool collecting() const;
  bool keeps_apart() const { return !kept_batch_.empty(); }

  const std::vector<float>& sum() const { return sum_; }
  double weight() const { return weight_; }
  const std::vector<int>& workers() const { return workers_; }  // whose gradients are in the sum
  // The smallest learning-rate factor of the workers in the sum (1 when none sent one).
  float lr_factor() const { return workers_.empty() ? 1.0f : lr_factor_; }
  // Did a worker in the sum skip its step? The round then applies no update.
  bool skip() const { return skip_; }

  // Parks an exchange until the round closes (exchanges that gave up meanwhile are dropped, keeping it bounded).
  void Park(std::shared_ptr<ExchangeWaiter> waiter);
  // Hands over the parked exchanges, leaving the round as it is (shutdown, a chunk moved away).
  std::vector<std::shared_ptr<ExchangeWaiter>> TakeWaiters();
  // The round is over (applied or dropped): the next one starts empty. Returns its parked exchanges.
  std::vector<std::shared_ptr<ExchangeWaiter>> Reset();

 private:
  std::vector<float> sum_;
  double weight_ = 0;
  std::vector<int> workers_;
  std::vector<std::vector<float>> kept_;  // backup workers: per worker
  std::vector<int> kept_batch_;           // backup workers: per worker, 0 = nothing kept
  std::vector<RoundTerms> kept_terms_;         // backup workers: per worker
  float lr_factor_ = 1.0f;
  bool skip_ = false;
  std::vector<std::shared_ptr<ExchangeWaiter>> waiters_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_TABLES_SYNC_ROUND_H_
