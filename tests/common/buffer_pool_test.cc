#include "common/rpc/buffer_pool.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(BufferPoolTest, AReleasedBufferIsReusedForTheSameSizeClass) {
  BufferPool pool(1 << 20);
  const char* first;
  {
    std::shared_ptr<PooledBuffer> a = pool.Get(5000);
    EXPECT_GE(a->capacity(), 5000u);
    first = a->data();
  }
  EXPECT_EQ(pool.cached_bytes(), 8192u);
  std::shared_ptr<PooledBuffer> b = pool.Get(6000);
  EXPECT_EQ(b->data(), first) << "same class: the freed buffer comes back";
  EXPECT_EQ(pool.cached_bytes(), 0u);
}

TEST(BufferPoolTest, CachedBytesNeverExceedTheAllowance) {
  BufferPool pool(64 << 10);
  {
    std::vector<std::shared_ptr<PooledBuffer>> held;
    for (int i = 0; i < 10; ++i) held.push_back(pool.Get(32 << 10));
  }
  EXPECT_LE(pool.cached_bytes(), 64u << 10);
}

TEST(BufferPoolTest, BuffersMayOutliveThePoolAndSlicesHoldThem) {
  grpc::Slice slice;
  {
    BufferPool pool;
    std::shared_ptr<PooledBuffer> buf = pool.Get(16);
    std::memcpy(buf->data(), "0123456789abcdef", 16);
    slice = BufferSlice(buf, 16);
  }
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(slice.begin()), slice.size()), "0123456789abcdef");
}

TEST(BufferPoolTest, ConcurrentGetAndReleaseNeverShareABuffer) {
  BufferPool pool(1 << 20);
  std::vector<std::thread> threads;
  std::atomic<int> overlaps{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, &overlaps, t] {
      for (int i = 0; i < 2000; ++i) {
        std::shared_ptr<PooledBuffer> buf = pool.Get(4096 * (1 + i % 3));
        std::memset(buf->data(), t, 64);
        std::this_thread::yield();
        for (int k = 0; k < 64; ++k) {
          if (buf->data()[k] != static_cast<char>(t)) ++overlaps;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(overlaps.load(), 0);
}

}  // namespace
}  // namespace tessera
