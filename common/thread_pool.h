// Runs submitted tasks on a fixed set of threads of its own, in submission order (a pool of one thread runs
// them one at a time, in order).
//
//   ThreadPool pool(2);
//   pool.Submit([] { ApplyLargeUpdate(); });   // never blocks the submitter
//
// Servers hand large updates to one, so that a gRPC thread never spends milliseconds in an update rule; the
// scheduler's control plane uses a one-thread pool (SerialExecutor) so that slow control work never runs on a
// gRPC thread and work submitted in order is done in order.
#ifndef TESSERA_COMMON_THREAD_POOL_H_
#define TESSERA_COMMON_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace tessera {

// Thread-safe.
class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  // Runs what was submitted before, then joins.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Submit(std::function<void()> task);

 private:
  void Run();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// One thread: tasks run one at a time, in the order submitted. Thread-safe.
class SerialExecutor : public ThreadPool {
 public:
  SerialExecutor() : ThreadPool(1) {}
};

}  // namespace tessera

#endif  // TESSERA_COMMON_THREAD_POOL_H_
