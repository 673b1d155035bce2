#include "common/rpc/buffer_pool.h"

#include <utility>

namespace tessera {

struct BufferPool::State {
  explicit State(size_t max) : max_cached_bytes(max) {}
  const size_t max_cached_bytes;
  absl::Mutex mu;
  size_t cached_bytes ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::vector<std::unique_ptr<PooledBuffer>>> free ABSL_GUARDED_BY(mu) =
      std::vector<std::vector<std::unique_ptr<PooledBuffer>>>(64);
};

namespace {
// Smallest power-of-two class (at least 4 KiB) that holds `bytes`.
int SizeClass(size_t bytes) {
  int c = 12;
  while ((size_t{1} << c) < bytes) ++c;
  return c;
}
}  // namespace

BufferPool::BufferPool(size_t max_cached_bytes) : state_(std::make_shared<State>(max_cached_bytes)) {}

std::shared_ptr<PooledBuffer> BufferPool::Get(size_t bytes) {
  const int c = SizeClass(bytes);
  std::unique_ptr<PooledBuffer> buffer;
  {
    absl::MutexLock lock(&state_->mu);
    auto& list = state_->free[c];
    if (!list.empty()) {
      buffer = std::move(list.back());
      list.pop_back();
      state_->cached_bytes -= buffer->capacity();
    }
  }
  if (!buffer) buffer = std::make_unique<PooledBuffer>(size_t{1} << c);
  // The deleter returns the buffer to the pool's state (kept alive by the deleter) or frees it.
  std::shared_ptr<State> state = state_;
  return std::shared_ptr<PooledBuffer>(buffer.release(), [state, c](PooledBuffer* b) {
    std::unique_ptr<PooledBuffer> owned(b);
    absl::MutexLock lock(&state->mu);
    if (state->cached_bytes + owned->capacity() > state->max_cached_bytes) return;
    state->cached_bytes += owned->capacity();
    state->free[c].push_back(std::move(owned));
  });
}

size_t BufferPool::cached_bytes() const {
  absl::MutexLock lock(&state_->mu);
  return state_->cached_bytes;
}

grpc::Slice BufferSlice(std::shared_ptr<const PooledBuffer> buffer, size_t length) {
  auto* holder = new std::shared_ptr<const PooledBuffer>(std::move(buffer));
  return grpc::Slice(const_cast<char*>((*holder)->data()), length,
                     [](void* p) { delete static_cast<std::shared_ptr<const PooledBuffer>*>(p); }, holder);
}

}  // namespace tessera
