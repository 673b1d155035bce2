// Reusable byte buffers for the data plane, so that a pull or a push does not allocate (and page-fault) a fresh
// buffer for every chunk.
//
//   BufferPool pool(/*max_cached_bytes=*/64 << 20);
//   std::shared_ptr<PooledBuffer> buf = pool.Get(bytes);   // at least `bytes` long, contents undefined
//   std::memcpy(buf->data(), src, bytes);
//   grpc::Slice slice = BufferSlice(buf, bytes);           // gRPC holds a reference until the bytes are sent
//
// A buffer goes back to its pool when its last reference is dropped (from any thread, even after the pool
// object itself was destroyed). Free buffers are kept in power-of-two size classes up to `max_cached_bytes` in
// total; beyond that they are freed, so the pool never holds more than that allowance.
#ifndef TESSERA_COMMON_RPC_BUFFER_POOL_H_
#define TESSERA_COMMON_RPC_BUFFER_POOL_H_

#include <cstddef>
#include <memory>
#include <vector>

#include <grpcpp/support/slice.h>

#include "absl/synchronization/mutex.h"

namespace tessera {

// One buffer, owned by whoever holds the shared_ptr. Not thread-safe (the bytes are the holder's).
class PooledBuffer {
 public:
  explicit PooledBuffer(size_t capacity) : data_(new char[capacity]), capacity_(capacity) {}
  char* data() { return data_.get(); }
  const char* data() const { return data_.get(); }
  size_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<char[]> data_;
  const size_t capacity_;
};

// Thread-safe.
class BufferPool {
 public:
  explicit BufferPool(size_t max_cached_bytes = 64 << 20);

  // A buffer of at least `bytes` bytes (contents undefined), reused when one of its size class is free.
  std::shared_ptr<PooledBuffer> Get(size_t bytes);

  // Bytes held in free buffers now (for tests and metrics).
  size_t cached_bytes() const;

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with every buffer handed out, which returns itself there
};

// A gRPC slice over the first `length` bytes of `buffer`, holding a reference to it until gRPC is done.
grpc::Slice BufferSlice(std::shared_ptr<const PooledBuffer> buffer, size_t length);

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_BUFFER_POOL_H_
