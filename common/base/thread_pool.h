// Runs submitted tasks on a fixed set of threads of its own, in submission order (a pool of one thread runs
// them one at a time, in order), or by priority where the submitter gives one: a waiting task of a lower
// priority number starts before those of higher ones, whenever they were submitted.
//
//   ThreadPool pool(2);
//   pool.Submit([] { ApplyLargeUpdate(); });   // never blocks the submitter
//   pool.Submit([] { ApplyFirstLayer(); }, /*priority=*/0);   // before waiting tasks of priority > 0
//
// Servers hand large updates to one, so that a gRPC thread never spends milliseconds in an update rule; the
// scheduler's control plane uses a one-thread pool (SerialExecutor) so that slow control work never runs on a
// gRPC thread and work submitted in order is done in order.
#ifndef TESSERA_COMMON_BASE_THREAD_POOL_H_
#define TESSERA_COMMON_BASE_THREAD_POOL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
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

  // Tasks of one priority run in submission order; the default priority (the largest) runs after all others.
  void Submit(std::function<void()> task, uint32_t priority = kLastPriority);

  static constexpr uint32_t kLastPriority = UINT32_MAX;

 private:
  void Run();

  absl::Mutex mu_;
  // By (priority, submission number).
  std::map<std::pair<uint32_t, uint64_t>, std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// One thread: tasks run one at a time, in the order submitted. Thread-safe.
class SerialExecutor : public ThreadPool {
 public:
  SerialExecutor() : ThreadPool(1) {}
};

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_THREAD_POOL_H_
