// A chunk's values as a pull or an exchange answers them, and one PushPull waiting for its answer.
#ifndef TESSERA_SERVER_TABLES_EXCHANGE_WAITER_H_
#define TESSERA_SERVER_TABLES_EXCHANGE_WAITER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/buffer_pool.h"
#include "common/model/wire_format.h"

namespace tessera {

// A chunk's values at one version. `bytes` holds `length` bytes of values in `precision`; null when the caller
// already held this version.
struct ChunkValues {
  int64_t version = 0;
  int64_t clock_version = 0;
  std::shared_ptr<const PooledBuffer> bytes;
  size_t length = 0;
  WirePrecision precision = tessera::v1::WireSpec::FP32;
  bool skipped = false;  // SYNC: the last round closed without an update, skipped by a worker (PushRequest.skip)
  double round_sq_norm = 0;  // the answer to a norm-only push (PushRequest.norm_only); no values come with it
};

// One PushPull waiting for its answer. Exactly one Complete() runs `done`; later ones do nothing, so the round
// closing and the caller giving up may race. Thread-safe.
class ExchangeWaiter {
 public:
  explicit ExchangeWaiter(std::function<void(absl::StatusOr<ChunkValues>)> done) : done_(std::move(done)) {}
  // Runs `done` with `result` unless it already ran; true when this call ran it.
  bool Complete(absl::StatusOr<ChunkValues> result);
  bool completed() const;

 private:
  mutable absl::Mutex mu_;
  std::function<void(absl::StatusOr<ChunkValues>)> done_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_TABLES_EXCHANGE_WAITER_H_
