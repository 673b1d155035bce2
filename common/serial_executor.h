// Runs submitted tasks one at a time, in order, on a thread of its own.
//
// The scheduler's control plane uses one so that slow control work (calling every server) never runs on a
// gRPC thread, and so that work submitted in order is done in order.
#ifndef TESSERA_COMMON_SERIAL_EXECUTOR_H_
#define TESSERA_COMMON_SERIAL_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace tessera {

// Thread-safe.
class SerialExecutor {
 public:
  SerialExecutor();
  // Runs what was submitted before, then joins.
  ~SerialExecutor();

  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  void Submit(std::function<void()> task);

 private:
  void Run();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_SERIAL_EXECUTOR_H_
