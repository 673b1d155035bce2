#include "server/tables/exchange_waiter.h"

#include <utility>

namespace tessera {

bool ExchangeWaiter::Complete(absl::StatusOr<ChunkValues> result) {
  std::function<void(absl::StatusOr<ChunkValues>)> done;
  {
    absl::MutexLock lock(&mu_);
    if (!done_) return false;
    done = std::move(done_);
    done_ = nullptr;
  }
  done(std::move(result));
  return true;
}

bool ExchangeWaiter::completed() const {
  absl::MutexLock lock(&mu_);
  return !done_;
}

}  // namespace tessera
